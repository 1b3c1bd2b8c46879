package collective_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/pattern"
	"github.com/slimego/slimego/internal/testranks"
	"github.com/slimego/slimego/kernels"
)

// useEmulator (TestMain) builds the emulated CUDA library (make
// kernels-emu) and points SLIME_CUDA_LIB at it, unless the variable names a
// library already (a GPU machine's libslimecuda.so): the CUDA tests then
// run on every machine, none skipped. Jobs the tests launch get
// SLIME_BACKEND=cpu unless it is set: auto would choose the emulator.
func useEmulator() error {
	if os.Getenv("SLIME_CUDA_LIB") == "" {
		path, err := kernels.BuildEmulator(".")
		if err != nil {
			return err
		}
		os.Setenv("SLIME_CUDA_LIB", path)
	}
	if os.Getenv("SLIME_BACKEND") == "" {
		os.Setenv("SLIME_BACKEND", "cpu")
	}
	return nil
}

// needGPU fails a test of the CUDA backend where the library does not
// load (TestMain points SLIME_CUDA_LIB at the emulator), and logs the
// emulator's seed, which replays a failing schedule (SLIME_EMU_SEED).
func needGPU(t *testing.T) {
	t.Helper()
	if err := device.CUDAAvailable(); err != nil {
		t.Fatalf("no CUDA library (%v): TestMain points SLIME_CUDA_LIB at the emulator unless it names one already", err)
	}
	if lib, err := kernels.Open(); err == nil && lib.Emulated() {
		t.Logf("emulated CUDA (%s), SLIME_EMU_SEED=%d", lib.Path(), lib.EmuSeed())
	}
}

// gpuOf is the communicator's GPU, nil on the CPU backend.
func gpuOf(c *collective.Communicator) *device.GPU {
	g, _ := c.Device().(*device.GPU)
	return g
}

// rankBlocksGPU allocates P×n bytes of device memory on c's GPU and fills
// this rank's n bytes of it (src, a view in place) with byte(rank+1), the
// blocks checkRankBlocks expects back. The caller frees dst.
func rankBlocksGPU(c *collective.Communicator, n int) (dst, src *device.CUDABuffer, err error) {
	dst, err = gpuOf(c).Alloc(c.Size() * n)
	if err != nil {
		return nil, nil, err
	}
	if src, err = dst.Slice(c.Rank()*n, n); err == nil {
		err = src.CopyFromHost(bytes.Repeat([]byte{byte(c.Rank() + 1)}, n))
	}
	if err != nil {
		dst.Free()
		return nil, nil, err
	}
	return dst, src, nil
}

// checkRankBlocks says where dst differs from every rank r's n bytes of
// byte(r+1) (rankBlocksGPU's), if anywhere.
func checkRankBlocks(dst *device.CUDABuffer, n int) error {
	got := make([]byte, dst.Len)
	if err := dst.CopyToHost(got); err != nil {
		return err
	}
	for i, b := range got {
		if r := i / n; b != byte(r+1) {
			return fmt.Errorf("rank %d's block differs at byte %d", r, i-r*n)
		}
	}
	return nil
}

// gpuScratch is the tests' GPU scratch block: every emulated allocation is
// shared host memory, and the default 16 MiB would cost 8 in-process
// ranks about 2 GiB. Blocks above it go in rounds.
const gpuScratch = 64 << 10

func gpuRanks(t *testing.T, P int, eager bool, scratch int, body func(c *collective.Communicator) error) {
	t.Helper()
	if scratch == 0 {
		scratch = gpuScratch
	}
	testranks.Run(t, 1, P, func(o *collective.Options) {
		o.Backend, o.Eager, o.GPUScratch = device.CUDA, eager, scratch
		o.Timeout = 30 * time.Second
	}, body)
}

// gatherGPU runs plan-and-check of n bytes per rank, iters times with
// fresh data, and returns the last gathered bytes.
func gatherGPU(ctx context.Context, c *collective.Communicator, counts []int, inPlace bool, iters int) ([]byte, error) {
	P, me, gpu := c.Size(), c.Rank(), gpuOf(c)
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
	plan, err := c.PlanBuffersV(ctx, dst, src, counts)
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
	for P := 1; P <= 8; P++ {
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

// One plan run 1,000 times back to back, with fresh data each time (the
// graph replays with the buffers' new contents): the epochs and parity
// slots cycle, graph and eager.
func TestGPUPlanReplays(t *testing.T) {
	needGPU(t)
	for _, eager := range []bool{false, true} {
		t.Run(fmt.Sprintf("eager=%v", eager), func(t *testing.T) {
			gpuRanks(t, 4, eager, 0, func(c *collective.Communicator) error {
				counts := []int{4099, 4099, 4099, 4099}
				_, err := gatherGPU(context.Background(), c, counts, false, 1000)
				return err
			})
		})
	}
}

// Graph and eager modes give the same bytes.
func TestGPUGraphEagerIdentical(t *testing.T) {
	needGPU(t)
	const P = 4
	var mu sync.Mutex
	got := map[bool][][]byte{}
	for _, eager := range []bool{false, true} {
		// A 4 KiB block: the 100,000-byte block goes in 25 rounds.
		gpuRanks(t, P, eager, 4096, func(c *collective.Communicator) error {
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
		// The GPU path is broken: a later call is ErrClosed, saying what
		// broke it, as on the CPU (it was the mismatch again).
		counts = []int{1000, 1000, 1000}
		_, err = gatherGPU(context.Background(), c, counts, false, 1)
		if !errors.Is(err, collective.ErrClosed) || errors.Is(err, collective.ErrSizeMismatch) || !strings.Contains(err.Error(), "broken by an earlier error") {
			return fmt.Errorf("a call after the mismatch: %v, want ErrClosed", err)
		}
		return nil
	})
}

// A rank that takes part in everything on the host (Init, the buffers, the
// plan and its barrier) but never launches its kernel makes the others'
// kernels give up at the timeout: every other rank's Run is ErrTimeout
// naming it, from the kernel's own report (its status word), not the host
// barrier's nor a lost peer's. The missing rank keeps its memory until the
// others have returned, as a live but stuck rank would.
func TestGPUPeerMissing(t *testing.T) {
	needGPU(t)
	const P, missing = 3, 2
	var others sync.WaitGroup
	others.Add(P - 1)
	testranks.Run(t, 1, P, func(o *collective.Options) {
		o.Backend, o.Timeout, o.GPUScratch = device.CUDA, 2*time.Second, gpuScratch
	}, func(c *collective.Communicator) error {
		ctx := context.Background()
		counts := []int{64, 64, 64}
		if c.Rank() == missing {
			dst, err := gpuOf(c).Alloc(3 * 64)
			if err != nil {
				return err
			}
			defer dst.Free()
			src, err := dst.Slice(missing*64, 64)
			if err != nil {
				return err
			}
			plan, err := c.PlanBuffersV(ctx, dst, src, counts)
			if err != nil {
				return err
			}
			defer plan.Close() // its barrier finds no one: its error is of no interest
			done := make(chan struct{})
			go func() { others.Wait(); close(done) }()
			select {
			case <-done:
				return nil
			case <-time.After(time.Minute):
				return errors.New("the other ranks did not return within a minute")
			}
		}
		defer others.Done()
		start := time.Now()
		_, err := gatherGPU(ctx, c, counts, false, 1)
		var oe *collective.OpError
		if !errors.Is(err, collective.ErrTimeout) || !errors.As(err, &oe) || oe.Peer != missing {
			return fmt.Errorf("err = %v, want ErrTimeout naming rank %d", err, missing)
		}
		if !strings.Contains(err.Error(), "GPU kernel waited") {
			return fmt.Errorf("err = %v, want the kernel's own timeout (its status word), not the host's", err)
		}
		if el := time.Since(start); el > 20*time.Second {
			return fmt.Errorf("the timeout took %v", el)
		}
		return nil
	})
}

// The CUDA backend as processes, through slimerun: slimebench allgather
// --backend cuda on 1 to 8 ranks, odd sizes, blocks of several rounds
// (a 64 KiB scratch block), graph and eager modes, every gathered byte
// checked (0 wrong), and the table says emulated where the library is the
// emulator; slimebench overlap --backend cuda checks its GEMMs' shapes run.
func TestGPUSlimebenchProcesses(t *testing.T) {
	needGPU(t)
	emulated := device.CUDAEmulated()
	env := []string{"SLIME_GPU_SCRATCH=64K", "SLIME_TIMEOUT=60s", "SLIME_BACKEND=cuda"}
	for P := 1; P <= 8; P++ {
		for _, eager := range []bool{false, true} {
			if eager && P%3 != 2 {
				continue // eager on 2, 5 and 8 ranks: the graph is the common case
			}
			t.Run(fmt.Sprintf("allgather/P=%d/eager=%v", P, eager), func(t *testing.T) {
				args := []string{"--nproc-per-node", strconv.Itoa(P), "slimebench", "allgather", "--backend", "cuda",
					"-b", "7", "-e", "200K", "-f", "13", "-n", "2", "-w", "1", "--quiet"}
				if eager {
					args = append(args, "--eager-mode")
				}
				j := slimerun(t, env, args...)
				if j.code != 0 {
					t.Fatalf("exit %d\n%s\n%s", j.code, j.out, j.stderr)
				}
				checkGPUTable(t, j.out, emulated, 5, map[bool]string{false: "launch=graph", true: "launch=eager"}[eager])
			})
		}
	}
	t.Run("overlap/P=3", func(t *testing.T) {
		j := slimerun(t, env, "--nproc-per-node", "3", "slimebench", "overlap", "--backend", "cuda",
			"--m-min", "16", "--m-max", "32", "--nk", "48", "--iters", "1", "--quiet")
		if j.code != 0 {
			t.Fatalf("exit %d\n%s\n%s", j.code, j.out, j.stderr)
		}
		if !strings.Contains(j.out, "allgather+gemm: P=3") || strings.Count(j.out, " float32 ") != 2 {
			t.Errorf("want a table of two float32 shapes:\n%s", j.out)
		}
		if got := strings.Contains(j.out, "emulated") && strings.Contains(j.out, "EMULATED"); got != emulated {
			t.Errorf("the table says emulated: %v, the library is the emulator: %v\n%s", got, emulated, j.out)
		}
	})
}

// checkGPUTable checks an allgather table of rows sizes: 0 wrong bytes,
// the launch mode, and "emulated" in its header exactly when the library
// is the emulator.
func checkGPUTable(t *testing.T, out string, emulated bool, rows int, launch string) {
	t.Helper()
	if !strings.Contains(out, "# Out of bounds values : 0 OK") {
		t.Errorf("wrong bytes, or no table:\n%s", out)
	}
	if !strings.Contains(out, launch) {
		t.Errorf("the header does not say %s:\n%s", launch, out)
	}
	if n := strings.Count(out, " uint8 "); n != rows {
		t.Errorf("%d rows, want %d:\n%s", n, rows, out)
	}
	header := out
	if i := strings.Index(out, "# size:"); i >= 0 {
		header = out[:i]
	}
	if got := strings.Contains(header, "backend=cuda-emu (emulated)") && strings.Contains(header, "EMULATED"); got != emulated {
		t.Errorf("the header says emulated: %v, the library is the emulator: %v\n%s", got, emulated, header)
	}
}

// Across nodes without NVSHMEM (in-process nodes share a process, which
// NVSHMEM cannot take), GPU plans run hier over the LL group and TCP,
// blocks staged through pinned host memory: 2 nodes of 2 ranks, equal and
// uneven blocks, synchronous "staged" mode, every byte checked.
func TestGPUAcrossNodesHostStaged(t *testing.T) {
	needGPU(t)
	testranks.Run(t, 2, 2, func(o *collective.Options) {
		o.Backend, o.GPUScratch, o.Timeout = device.CUDA, gpuScratch, 30*time.Second
	}, func(c *collective.Communicator) error {
		ctx := context.Background()
		if c.Backend() != device.CUDA || c.Stream() == nil {
			return fmt.Errorf("backend %v, stream %v", c.Backend(), c.Stream())
		}
		for _, counts := range [][]int{{4097, 4097, 4097, 4097}, {0, 70_001, 5, 64 << 10}} {
			if _, err := gatherGPU(ctx, c, counts, false, 2); err != nil {
				return err
			}
		}
		// PlanBuffers, equal blocks, in place.
		const n = 1001
		dst, err := gpuOf(c).Alloc(c.Size() * n)
		if err != nil {
			return err
		}
		defer dst.Free()
		src, err := dst.Slice(c.Rank()*n, n)
		if err != nil {
			return err
		}
		plan, err := c.PlanBuffers(ctx, dst, src)
		if err != nil {
			return err
		}
		defer plan.Close()
		if plan.Mode() != "staged" || !strings.Contains(plan.String(), "over host-staged tcp") {
			return fmt.Errorf("plan %q, mode %s: want hier over the staged link across nodes", plan, plan.Mode())
		}
		host := make([]byte, c.Size()*n)
		pattern.Fill(host[c.Rank()*n:(c.Rank()+1)*n], pattern.Seed(c.Rank(), 9, n))
		if err := src.CopyFromHost(host[c.Rank()*n : (c.Rank()+1)*n]); err != nil {
			return err
		}
		if err := plan.Run(ctx); err != nil {
			return err
		}
		if err := dst.CopyToHost(host); err != nil {
			return err
		}
		for r := range c.Size() {
			if i := pattern.Check(host[r*n:(r+1)*n], pattern.Seed(r, 9, n)); i >= 0 {
				return fmt.Errorf("PlanBuffers across nodes: block of rank %d wrong at byte %d", r, i)
			}
		}
		return nil
	})
}

// Plans that cannot be made are ErrInvalid at once, on the rank that asks,
// with no collective call begun: a dst too small, counts of the wrong
// length, a negative count, a src that disagrees with its count, and any
// plan of device memory on a communicator of the CPU backend.
func TestGPUInvalidPlans(t *testing.T) {
	needGPU(t)
	for _, backend := range []device.Kind{device.CUDA, device.CPU} {
		t.Run(backend.String(), func(t *testing.T) {
			testranks.Run(t, 1, 2, func(o *collective.Options) {
				o.Backend, o.GPUScratch = backend, gpuScratch
			}, func(c *collective.Communicator) error {
				ctx := context.Background()
				if backend == device.CPU {
					if gpuOf(c) != nil || c.Device().Kind() != device.CPU {
						return errors.New("a CPU communicator has a GPU")
					}
					var buf device.CUDABuffer
					_, e1 := c.PlanBuffers(ctx, &buf, &buf)
					_, e2 := c.PlanBuffersV(ctx, &buf, &buf, []int{0, 0})
					_, e3 := c.PlanBuffersBlocks(ctx, &buf, &buf, []int{0, 0}, []int{0, 0})
					for i, err := range []error{e1, e2, e3} {
						if !errors.Is(err, collective.ErrInvalid) {
							return fmt.Errorf("call %d on the CPU backend: %v, want ErrInvalid", i+1, err)
						}
					}
					return nil
				}
				dst, err := gpuOf(c).Alloc(100)
				if err != nil {
					return err
				}
				defer dst.Free()
				src, err := dst.Slice(0, 60)
				if err != nil {
					return err
				}
				_, e1 := c.PlanBuffers(ctx, dst, src) // 2 × 60 > 100
				_, e2 := c.PlanBuffersV(ctx, dst, src, []int{60})
				_, e3 := c.PlanBuffersV(ctx, dst, src, []int{60, -1})
				_, e4 := c.PlanBuffersV(ctx, dst, src, []int{59, 30})
				_, e5 := c.PlanBuffersV(ctx, dst, src, []int{60, 50})
				_, e6 := c.PlanBuffersBlocks(ctx, dst, src, []int{60, 60}, []int{0, 50}) // rank 1's block ends at 110
				_, e7 := c.PlanBuffersBlocks(ctx, dst, src, []int{60}, []int{0})
				_, e8 := c.PlanBuffersBlocks(ctx, dst, src, []int{59, 1}, []int{0, 60})
				for i, err := range []error{e1, e2, e3, e4, e5, e6, e7, e8} {
					if !errors.Is(err, collective.ErrInvalid) {
						return fmt.Errorf("bad plan %d: %v, want ErrInvalid", i+1, err)
					}
				}
				return nil
			})
		})
	}
}

// Counts whose sum overflows int are ErrInvalid on the rank that passes
// them, as a dst too small is: the sum once wrapped negative, passed the
// dst check, and the LL kernel was planned to write the peers' blocks
// outside dst (the emulator caught it at capture; a GPU would not).
// Every rank passes such counts, so none begins a collective call.
func TestGPUPlanVCountsOverflow(t *testing.T) {
	needGPU(t)
	for _, eager := range []bool{false, true} {
		t.Run(fmt.Sprintf("eager=%v", eager), func(t *testing.T) {
			gpuRanks(t, 2, eager, 0, func(c *collective.Communicator) error {
				ctx := context.Background()
				dst, err := gpuOf(c).Alloc(64)
				if err != nil {
					return err
				}
				defer dst.Free()
				src, err := gpuOf(c).Alloc(8)
				if err != nil {
					return err
				}
				defer src.Free()
				counts := []int{8, 8}
				counts[1-c.Rank()] = math.MaxInt
				p, err := c.PlanBuffersV(ctx, dst, src, counts)
				if p != nil {
					p.Close()
				}
				if !errors.Is(err, collective.ErrInvalid) {
					return fmt.Errorf("counts %v: %v, want ErrInvalid", counts, err)
				}
				return nil
			})
		})
	}
}

// PlanBuffersBlocks places every rank's block where offs says (gaps, rank
// order reversed), on one node (the LL kernel, graph and eager) and across
// two (hier and the ring over the staged link): the blocks arrive byte for byte and
// the gaps keep what they held. A planned Run allocates nothing.
func TestGPUPlanBlocks(t *testing.T) {
	needGPU(t)
	for _, tc := range []struct {
		name           string
		nodes, perNode int
		eager          bool
		mode, algo     string
	}{
		{"node/graph", 1, 3, false, "graph", ""},
		{"node/eager", 1, 3, true, "eager", ""},
		{"2x2/hier", 2, 2, false, "staged", "hier"},
		{"2x2/ring", 2, 2, false, "staged", "ring"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testranks.Run(t, tc.nodes, tc.perNode, func(o *collective.Options) {
				o.Backend, o.Eager, o.GPUScratch, o.Algo = device.CUDA, tc.eager, gpuScratch, tc.algo
				o.Timeout = 30 * time.Second
			}, func(c *collective.Communicator) error {
				ctx := context.Background()
				P, me := c.Size(), c.Rank()
				sizes, offs := make([]int, P), make([]int, P)
				total := 7 // a gap before the first block
				for r := P - 1; r >= 0; r-- {
					sizes[r] = 1000 + 37*r
					offs[r] = total
					total += sizes[r] + 13 // and one after each
				}
				dst, err := gpuOf(c).Alloc(total)
				if err != nil {
					return err
				}
				defer dst.Free()
				src, err := gpuOf(c).Alloc(sizes[me])
				if err != nil {
					return err
				}
				defer src.Free()
				plan, err := c.PlanBuffersBlocks(ctx, dst, src, sizes, offs)
				if err != nil {
					return err
				}
				defer plan.Close()
				if plan.Mode() != tc.mode {
					return fmt.Errorf("mode %s, want %s", plan.Mode(), tc.mode)
				}
				host := make([]byte, total)
				for iter := range 2 {
					pattern.Fill(host, 0xfeed)
					if err := dst.CopyFromHost(host); err != nil {
						return err
					}
					own := make([]byte, sizes[me])
					pattern.Fill(own, pattern.Seed(me, iter, uint64(sizes[me])))
					if err := src.CopyFromHost(own); err != nil {
						return err
					}
					if err := plan.Run(ctx); err != nil {
						return err
					}
					if err := dst.CopyToHost(host); err != nil {
						return err
					}
					want := make([]byte, total)
					pattern.Fill(want, 0xfeed)
					for r := range P {
						pattern.Fill(want[offs[r]:offs[r]+sizes[r]], pattern.Seed(r, iter, uint64(sizes[r])))
					}
					if !bytes.Equal(host, want) {
						for j := range host {
							if host[j] != want[j] {
								return fmt.Errorf("iteration %d: byte %d of dst is %#x, want %#x", iter, j, host[j], want[j])
							}
						}
					}
				}
				allocs, err := testranks.AllocsPerRun(c, func() error { return plan.Run(ctx) })
				if err != nil {
					return err
				}
				if allocs >= 1 {
					return fmt.Errorf("%.1f allocations per planned run", allocs)
				}
				return nil
			})
		})
	}
}

// A source that overlaps the destination other than at this rank's own
// block (a slice of dst at another rank's offset, or straddling two
// blocks) is ErrInvalid at planning, as on the host path: the kernels
// would gather into the source while its later rounds, or the other
// blocks of the grid, still read it (each rank got a wrong block 0).
// Passed on every rank, nothing runs; graph and eager.
func TestGPUOverlappingSource(t *testing.T) {
	needGPU(t)
	for _, eager := range []bool{false, true} {
		t.Run(fmt.Sprintf("eager=%v", eager), func(t *testing.T) {
			gpuRanks(t, 3, eager, 4096, func(c *collective.Communicator) error {
				ctx := context.Background()
				const n = 10000
				P, me := c.Size(), c.Rank()
				dst, err := gpuOf(c).Alloc(P * n)
				if err != nil {
					return err
				}
				defer dst.Free()
				straddle := me*n + 100 // this rank's block and the next
				if me == P-1 {
					straddle = me*n - 100 // the previous one's and this rank's
				}
				for _, off := range []int{((me + 1) % P) * n, straddle, 1} {
					src, err := dst.Slice(off, n)
					if err != nil {
						return err
					}
					counts := []int{n, n, n}
					_, e1 := c.PlanBuffers(ctx, dst, src)
					_, e2 := c.PlanBuffersV(ctx, dst, src, counts)
					_, e3 := c.PlanBuffersBlocks(ctx, dst, src, counts, []int{0, n, 2 * n})
					for i, err := range []error{e1, e2, e3} {
						if !errors.Is(err, collective.ErrInvalid) || !strings.Contains(err.Error(), "overlaps") {
							return fmt.Errorf("source at offset %d of dst, plan %d: %v, want ErrInvalid (overlaps)", off, i+1, err)
						}
					}
				}
				// In place is still fine.
				_, err = gatherGPU(ctx, c, []int{n, n, n}, true, 2)
				return err
			})
		})
	}
}

// Buffers of another GPU than the communicator's (or of none) are
// ErrInvalid at planning: the plan's kernels run on the communicator's
// GPU and stream, where another device's memory faults (it was accepted,
// and the launch failed, or on a GPU the kernel would fault and take the
// process's CUDA context with it).
func TestGPUBufferOfAnotherDevice(t *testing.T) {
	needGPU(t)
	gpuRanks(t, 2, false, 0, func(c *collective.Communicator) error {
		ctx := context.Background()
		const n = 1000
		g := gpuOf(c)
		dst, err := g.Alloc(2 * n)
		if err != nil {
			return err
		}
		defer dst.Free()
		src, err := g.Alloc(n)
		if err != nil {
			return err
		}
		defer src.Free()
		other := &device.GPU{Ordinal: g.Ordinal + 1, Name: g.Name}
		for i, tc := range []struct{ dst, src *device.CUDABuffer }{
			{&device.CUDABuffer{Dev: other, Ptr: dst.Ptr, Len: dst.Len}, src},
			{dst, &device.CUDABuffer{Dev: other, Ptr: src.Ptr, Len: src.Len}},
			{&device.CUDABuffer{Ptr: dst.Ptr, Len: dst.Len}, src},
		} {
			_, e1 := c.PlanBuffers(ctx, tc.dst, tc.src)
			_, e2 := c.PlanBuffersV(ctx, tc.dst, tc.src, []int{n, n})
			_, e3 := c.PlanBuffersBlocks(ctx, tc.dst, tc.src, []int{n, n}, []int{0, n})
			for j, err := range []error{e1, e2, e3} {
				if !errors.Is(err, collective.ErrInvalid) || !strings.Contains(err.Error(), "device") {
					return fmt.Errorf("case %d, plan %d: %v, want ErrInvalid naming the device", i+1, j+1, err)
				}
			}
		}
		// The communicator is still usable.
		_, err = gatherGPU(ctx, c, []int{n, n}, false, 1)
		return err
	})
}

// A rank whose kernel failed announces nothing a peer takes for data:
// rank 0 plans rank 2's block as 9,000 bytes where rank 2 announces 100,
// so that its plan has three rounds of 4 KiB; the first sees the
// mismatch, and the two later rounds, already enqueued, run. The other
// ranks (whose plans agree) run theirs twice; rank 0 makes no second
// call, so the others' calls must fail (with the size status where they
// read rank 0's later rounds, or a timeout), never succeed. (Those rounds
// raised rank 0's flags, with its true total, at the epochs of the
// others' second call: it returned nil, with a rank 0 block never sent.)
// Graph and eager.
func TestGPUFailedRankPoisonsItsRounds(t *testing.T) {
	needGPU(t)
	for _, eager := range []bool{false, true} {
		t.Run(fmt.Sprintf("eager=%v", eager), func(t *testing.T) {
			testranks.Run(t, 1, 3, func(o *collective.Options) {
				o.Backend, o.Eager, o.GPUScratch, o.Timeout = device.CUDA, eager, 4096, 2*time.Second
			}, func(c *collective.Communicator) error {
				ctx := context.Background()
				if c.Rank() == 0 {
					_, err := gatherGPU(ctx, c, []int{100, 100, 9000}, false, 1)
					if !errors.Is(err, collective.ErrSizeMismatch) {
						return fmt.Errorf("rank 0: %v, want ErrSizeMismatch", err)
					}
					return nil
				}
				_, err := gatherGPU(ctx, c, []int{100, 100, 100}, false, 2)
				var oe *collective.OpError
				if !(errors.Is(err, collective.ErrSizeMismatch) || errors.Is(err, collective.ErrTimeout)) || !errors.As(err, &oe) || oe.Peer < 0 {
					return fmt.Errorf("two calls, rank 0 in the first only: %v, want ErrSizeMismatch or ErrTimeout naming a peer", err)
				}
				return nil
			})
		})
	}
}
