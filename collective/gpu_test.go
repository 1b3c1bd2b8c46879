package collective_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/pattern"
	"github.com/slimego/slimego/internal/testranks"
)

// needGPU skips a test of the CUDA backend where it cannot run, saying why.
func needGPU(t *testing.T) {
	t.Helper()
	if err := device.CUDAAvailable(); err != nil {
		t.Skipf("skipped: no GPU here (%v); the CUDA tests run where make kernels built libslimecuda.so and a GPU is present (make device-check)", err)
	}
}

func gpuRanks(t *testing.T, P int, eager bool, scratch int, body func(c *collective.Communicator) error) {
	t.Helper()
	testranks.Run(t, 1, P, func(o *collective.Options) {
		o.Backend, o.Eager, o.GPUScratch = device.CUDA, eager, scratch
		o.Timeout = 30 * time.Second
	}, body)
}

// gatherGPU runs plan-and-check of n bytes per rank, iters times with
// fresh data, and returns the last gathered bytes.
func gatherGPU(ctx context.Context, c *collective.Communicator, counts []int, inPlace bool, iters int) ([]byte, error) {
	P, me, gpu := c.Size(), c.Rank(), c.GPU()
	offs := make([]int, P+1)
	for r := range P {
		offs[r+1] = offs[r] + counts[r]
	}
	dst, err := gpu.Alloc(offs[P])
	if err != nil {
		return nil, err
	}
	defer dst.Free()
	src, err := dst.Slice(offs[me], counts[me])
	if err != nil {
		return nil, err
	}
	if !inPlace {
		if src, err = gpu.Alloc(counts[me]); err != nil {
			return nil, err
		}
		defer src.Free()
	}
	plan, err := c.PlanGPUV(ctx, dst, src, counts)
	if err != nil {
		return nil, err
	}
	defer plan.Close()
	host := make([]byte, offs[P])
	for it := range iters {
		pattern.Fill(host, uint64(0xbad0+it))
		if err := dst.CopyFromHost(host); err != nil {
			return nil, err
		}
		blk := host[offs[me]:offs[me+1]]
		pattern.Fill(blk, pattern.Seed(me, it, uint64(counts[me])))
		if err := src.CopyFromHost(blk); err != nil {
			return nil, err
		}
		if err := plan.Run(ctx); err != nil {
			return nil, err
		}
		if err := dst.CopyToHost(host); err != nil {
			return nil, err
		}
		for r := range P {
			if i := pattern.Check(host[offs[r]:offs[r+1]], pattern.Seed(r, it, uint64(counts[r]))); i >= 0 {
				return nil, fmt.Errorf("%s, %d bytes from rank %d, iteration %d: wrong at byte %d", plan, counts[r], r, it, i)
			}
		}
	}
	return host, nil
}

func TestGPUAllGather(t *testing.T) {
	needGPU(t)
	for _, P := range []int{1, 2, 4, 8} {
		for _, eager := range []bool{false, true} {
			t.Run(fmt.Sprintf("P=%d/eager=%v", P, eager), func(t *testing.T) {
				// A 64 KiB scratch block makes the larger sizes go in rounds.
				gpuRanks(t, P, eager, 64<<10, func(c *collective.Communicator) error {
					ctx := context.Background()
					for _, n := range []int{0, 1, 8, 15, 4097, 65536, 200_003, 1<<20 + 3} {
						counts := make([]int, P)
						for r := range counts {
							counts[r] = n
						}
						for _, inPlace := range []bool{false, true} {
							if _, err := gatherGPU(ctx, c, counts, inPlace, 3); err != nil {
								return err
							}
						}
					}
					// Uneven blocks, some empty.
					counts := make([]int, P)
					for r := range counts {
						counts[r] = (r * 7919) % 100_000
					}
					_, err := gatherGPU(ctx, c, counts, false, 3)
					return err
				})
			})
		}
	}
}

// One plan run many times back to back: the epochs and parity slots cycle.
func TestGPUPlanReplays(t *testing.T) {
	needGPU(t)
	gpuRanks(t, 4, false, 0, func(c *collective.Communicator) error {
		counts := []int{4099, 4099, 4099, 4099}
		_, err := gatherGPU(context.Background(), c, counts, false, 1000)
		return err
	})
}

// Graph and eager modes give the same bytes.
func TestGPUGraphEagerIdentical(t *testing.T) {
	needGPU(t)
	const P = 4
	var mu sync.Mutex
	got := map[bool][][]byte{}
	for _, eager := range []bool{false, true} {
		gpuRanks(t, P, eager, 0, func(c *collective.Communicator) error {
			counts := []int{1, 100_000, 33, 4096}
			out, err := gatherGPU(context.Background(), c, counts, false, 5)
			if err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			if got[eager] == nil {
				got[eager] = make([][]byte, P)
			}
			got[eager][c.Rank()] = out
			return nil
		})
	}
	for r := range P {
		if !bytes.Equal(got[false][r], got[true][r]) {
			t.Errorf("rank %d: graph and eager results differ", r)
		}
	}
}

// A rank that plans another size makes every rank fail with
// ErrSizeMismatch naming a peer, within the timeout.
func TestGPUSizeMismatch(t *testing.T) {
	needGPU(t)
	gpuRanks(t, 3, false, 0, func(c *collective.Communicator) error {
		n := 1000
		if c.Rank() == 1 {
			n = 1001
		}
		counts := []int{n, n, n}
		_, err := gatherGPU(context.Background(), c, counts, false, 1)
		var oe *collective.OpError
		if !errors.Is(err, collective.ErrSizeMismatch) || !errors.As(err, &oe) || oe.Peer < 0 {
			return fmt.Errorf("err = %v, want ErrSizeMismatch naming a peer", err)
		}
		return nil
	})
}

// A rank that never calls makes the others time out naming it.
func TestGPUPeerMissing(t *testing.T) {
	needGPU(t)
	testranks.Run(t, 1, 3, func(o *collective.Options) {
		o.Backend, o.Timeout = device.CUDA, 2*time.Second
	}, func(c *collective.Communicator) error {
		if c.Rank() == 2 {
			return nil
		}
		start := time.Now()
		_, err := gatherGPU(context.Background(), c, []int{64, 64, 64}, false, 1)
		var oe *collective.OpError
		if !errors.Is(err, collective.ErrTimeout) || !errors.As(err, &oe) || oe.Peer != 2 {
			return fmt.Errorf("err = %v, want ErrTimeout naming rank 2", err)
		}
		if el := time.Since(start); el > 20*time.Second {
			return fmt.Errorf("the timeout took %v", el)
		}
		return nil
	})
}
