package collective_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/testranks"
)

// TestGPUAcrossNodesAlgo: a GPU job of 2 nodes × 2 ranks runs the job's
// algorithm (hier or the ring, Options.Algo) over device memory, the
// blocks staged through pinned host memory and TCP: the plan says so
// (mode "staged", "<algo> over host-staged tcp"), and PlanBuffersBlocks with
// random odd sizes (one of them 0, some above the LL scratch block, so
// that the node's kernels go in rounds) and gaps between the blocks
// gathers every byte, in place and not, several times with fresh data,
// leaving the gaps untouched; PlanBuffersV with uneven counts likewise.
func TestGPUAcrossNodesAlgo(t *testing.T) {
	needGPU(t)
	for _, algo := range []string{"hier", "ring"} {
		t.Run(algo, func(t *testing.T) {
			testranks.Run(t, 2, 2, func(o *collective.Options) {
				o.Backend, o.GPUScratch, o.Timeout, o.Algo = device.CUDA, gpuScratch, 30*time.Second, algo
			}, func(c *collective.Communicator) error {
				ctx := context.Background()
				for round := range 3 {
					if err := gatherBlocksGPU(ctx, c, algo, uint64(round)); err != nil {
						return fmt.Errorf("round %d: %w", round, err)
					}
				}
				_, err := gatherGPU(ctx, c, []int{3, 0, 70_001, 1}, false, 2)
				return err
			})
		})
	}
}

// gatherBlocksGPU plans PlanBuffersBlocks of sizes drawn from seed (the same
// on every rank), with 3-byte gaps, in place or not as seed says, runs it
// twice with fresh data and checks dst byte for byte.
func gatherBlocksGPU(ctx context.Context, c *collective.Communicator, algo string, seed uint64) error {
	P, me, gpu := c.Size(), c.Rank(), gpuOf(c)
	rng := rand.New(rand.NewPCG(seed, 42))
	sizes, offs := make([]int, P), make([]int, P)
	total := 0
	for r := range sizes {
		sizes[r] = rng.IntN(150_000) | 1 // odd, some above the 64 KiB scratch
		if r == int(seed)%P {
			sizes[r] = 0
		}
		offs[r], total = total+3, total+3+sizes[r]
	}
	total += 5
	dst, err := gpu.Alloc(total)
	if err != nil {
		return err
	}
	defer dst.Free()
	inPlace := seed%2 == 0
	src, err := dst.Slice(offs[me], sizes[me])
	if err != nil {
		return err
	}
	if !inPlace {
		if src, err = gpu.Alloc(sizes[me]); err != nil {
			return err
		}
		defer src.Free()
	}
	plan, err := c.PlanBuffersBlocks(ctx, dst, src, sizes, offs)
	if err != nil {
		return err
	}
	defer plan.Close()
	if plan.Mode() != "staged" || !strings.Contains(plan.String(), "across nodes: "+algo+" over host-staged tcp") {
		return fmt.Errorf("plan %q, mode %s: want %s over the staged link", plan, plan.Mode(), algo)
	}
	const fill = 0xA5
	for it := range 2 {
		blocks := make([][]byte, P)
		for r := range P {
			br := rand.New(rand.NewPCG(seed, uint64(it*P+r)))
			blocks[r] = make([]byte, sizes[r])
			for i := range blocks[r] {
				blocks[r][i] = byte(br.Uint32())
			}
		}
		want := bytes.Repeat([]byte{fill}, total)
		host := bytes.Repeat([]byte{fill}, total)
		if inPlace {
			copy(host[offs[me]:], blocks[me])
		} else if err := src.CopyFromHost(blocks[me]); err != nil {
			return err
		}
		if err := dst.CopyFromHost(host); err != nil {
			return err
		}
		for r := range P {
			copy(want[offs[r]:], blocks[r])
		}
		if err := plan.Run(ctx); err != nil {
			return fmt.Errorf("iteration %d (in place %v): %w", it, inPlace, err)
		}
		if err := dst.CopyToHost(host); err != nil {
			return err
		}
		if !bytes.Equal(host, want) {
			i := 0
			for host[i] == want[i] {
				i++
			}
			return fmt.Errorf("iteration %d (in place %v, sizes %v): dst differs first at byte %d (%#x, want %#x)", it, inPlace, sizes, i, host[i], want[i])
		}
	}
	return nil
}

// TestGPUAcrossNodesMismatchCloses: in a GPU job of 2 nodes × 2 ranks, one
// rank plans its block one byte longer than the others think. Every rank's
// Run returns ErrSizeMismatch, none after waiting for its timeout, and the
// GPU path across nodes is closed: the next Run, and a new plan, are
// ErrClosed at once, saying what broke it (as on the CPU), under hier
// and the ring alike.
func TestGPUAcrossNodesMismatchCloses(t *testing.T) {
	needGPU(t)
	for _, tc := range []struct {
		algo string
		liar int
	}{{"hier", 1}, {"hier", 2}, {"ring", 3}} {
		t.Run(fmt.Sprintf("%s/liar%d", tc.algo, tc.liar), func(t *testing.T) {
			start := time.Now()
			testranks.Run(t, 2, 2, func(o *collective.Options) {
				o.Backend, o.GPUScratch, o.Timeout, o.Algo = device.CUDA, gpuScratch, 30*time.Second, tc.algo
			}, func(c *collective.Communicator) error {
				ctx := context.Background()
				P := c.Size()
				dst, err := gpuOf(c).Alloc(P * 2000)
				if err != nil {
					return err
				}
				defer dst.Free()
				sizes, offs := make([]int, P), make([]int, P)
				for r := range P {
					sizes[r], offs[r] = 1000+r, r*2000
				}
				if c.Rank() == tc.liar {
					sizes[tc.liar]++
				}
				src, err := dst.Slice(offs[c.Rank()], sizes[c.Rank()])
				if err != nil {
					return err
				}
				plan, err := c.PlanBuffersBlocks(ctx, dst, src, sizes, offs)
				if err != nil {
					return err
				}
				defer plan.Close()
				if err := plan.Run(ctx); !errors.Is(err, collective.ErrSizeMismatch) {
					return fmt.Errorf("call 0: %v, want ErrSizeMismatch", err)
				}
				closed := func(err error) bool {
					return errors.Is(err, collective.ErrClosed) && strings.Contains(err.Error(), "size mismatch")
				}
				if err := plan.Run(ctx); !closed(err) {
					return fmt.Errorf("call 1: %v, want ErrClosed saying the mismatch broke it", err)
				}
				if _, err := c.PlanBuffersBlocks(ctx, dst, src, sizes, offs); !closed(err) {
					return fmt.Errorf("a new plan after the mismatch: %v, want ErrClosed saying the mismatch broke it", err)
				}
				return nil
			})
			if el := time.Since(start); el > 20*time.Second {
				t.Errorf("the mismatch took %v to reach every rank: some waited for a timeout", el)
			}
		})
	}
}

// TestGPUAcrossNodesLateGrowth: under hier, a plan whose blocks outgrow
// the staged link's pinned buffers readies them when it is made, not when
// it runs. cudaFreeHost waits for every kernel of the device (the
// emulator's too), and all four ranks here share one: a rank that freed
// its smaller buffers in Run, after its node peer's LL kernel had started
// waiting for it, stalled both until the kernel's timeout (on an H200, at
// the third plan of TestGPUAcrossNodesAlgo). Rank 1 comes late to each
// Run, so that rank 0's kernel is waiting by then.
func TestGPUAcrossNodesLateGrowth(t *testing.T) {
	needGPU(t)
	testranks.Run(t, 2, 2, func(o *collective.Options) {
		o.Backend, o.GPUScratch, o.Timeout, o.Algo = device.CUDA, gpuScratch, 5*time.Second, "hier"
	}, func(c *collective.Communicator) error {
		ctx := context.Background()
		me := c.Rank()
		for _, n := range []int{1000, 100_001} {
			dst, src, err := rankBlocksGPU(c, n)
			if err != nil {
				return err
			}
			defer dst.Free()
			plan, err := c.PlanBuffers(ctx, dst, src)
			if err != nil {
				return err
			}
			defer plan.Close()
			if me == 1 {
				time.Sleep(300 * time.Millisecond)
			}
			start := time.Now()
			if err := plan.Run(ctx); err != nil {
				return fmt.Errorf("blocks of %d bytes: %w (after %v)", n, err, time.Since(start).Round(time.Millisecond))
			}
			if err := checkRankBlocks(dst, n); err != nil {
				return fmt.Errorf("blocks of %d bytes: %w", n, err)
			}
		}
		return nil
	})
}
