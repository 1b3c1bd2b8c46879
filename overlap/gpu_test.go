package overlap

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
	"github.com/slimego/slimego/internal/testranks"
)

func gpuBytes[T Float](s []T) []byte { return asBytes(s) }

// checkGPU runs the GPU operator on P in-process ranks, four times with
// fresh A, each way of running it (overlapped, sequential, and the gather
// then the GEMMs on their own), against one GEMM of the whole gathered A
// (reference); the gathered A itself must be every rank's rows, bit for
// bit. It returns every rank's last C.
func checkGPU[T Float](t *testing.T, P, m, n, k, pieces int, eager bool, tol float64) [][]byte {
	t.Helper()
	return checkGPUOn[T](t, 1, P, m, n, k, pieces, eager, tol)
}

// checkGPUOn is checkGPU on nodes × perNode ranks; the gather is cut into
// the pieces asked for, however small.
func checkGPUOn[T Float](t *testing.T, nodes, perNode, m, n, k, pieces int, eager bool, tol float64) [][]byte {
	t.Helper()
	P := nodes * perNode
	var mu sync.Mutex
	out := make([][]byte, P)
	testranks.Run(t, nodes, perNode, func(o *collective.Options) {
		// A small scratch block: every emulated allocation is shared host
		// memory.
		o.Backend, o.Eager, o.Timeout, o.GPUScratch = device.CUDA, eager, 30*time.Second, 64<<10
	}, func(c *collective.Communicator) error {
		ctx := context.Background()
		o, err := NewWith[T](ctx, c, m, n, k, Options{Pieces: pieces, MinPieceBytes: -1})
		if err != nil {
			return err
		}
		defer o.Close()
		if want := min(pieces, max(m, 1)); o.Pieces() != want {
			return fmt.Errorf("%d pieces, want %d", o.Pieces(), want)
		}
		a, b, cHost := make([]T, m*k), make([]T, k*n), make([]T, P*m*n)
		fillRand(b, 99)
		if err := o.WriteB(b); err != nil {
			return err
		}
		for iter := range 4 {
			fillRand(a, uint64(c.Rank()*1000+iter))
			if err := o.WriteA(a); err != nil {
				return err
			}
			var err error
			switch iter {
			case 1:
				err = o.RunSequential(ctx)
			case 2:
				if err = o.Gather(ctx); err == nil {
					err = o.GEMM(ctx)
				}
			default:
				err = o.Run(ctx)
			}
			if err != nil {
				return err
			}
			if err := o.ReadC(cHost); err != nil {
				return err
			}
			if e := relErr(cHost, reference(P, m, n, k, b, iter)); e > tol {
				return fmt.Errorf("%s mode, iteration %d: relative error %.3g > %.3g", o.Mode(), iter, e, tol)
			}
			if iter == 2 {
				g, want := make([]T, P*m*k), make([]T, P*m*k)
				if err := o.ReadG(g); err != nil {
					return err
				}
				for r := range P {
					fillRand(want[r*m*k:(r+1)*m*k], uint64(r*1000+iter))
				}
				if !bytes.Equal(gpuBytes(g), gpuBytes(want)) {
					return fmt.Errorf("%s mode: the gathered A differs from the ranks' rows", o.Mode())
				}
			}
		}
		mu.Lock()
		out[c.Rank()] = append([]byte(nil), gpuBytes(cHost)...)
		mu.Unlock()
		return nil
	})
	return out
}

func TestGPUOverlap(t *testing.T) {
	if err := device.CUDAAvailable(); err != nil {
		t.Fatalf("no CUDA library (%v): TestMain points SLIME_CUDA_LIB at the emulator unless it names one already", err)
	}
	type shape struct{ m, n, k, pieces int }
	shapes := []shape{{37, 19, 53, 3}, {64, 64, 256, 4}, {1, 7, 1, 1}}
	for _, P := range []int{1, 2, 3, 4, 8} {
		for _, sh := range shapes {
			if P == 8 && sh.m != 37 {
				continue // eight ranks: one shape, of odd sizes and three pieces
			}
			m, n, k, pieces := sh.m, sh.n, sh.k, sh.pieces
			t.Run(fmt.Sprintf("P=%d/%dx%dx%d", P, m, n, k), func(t *testing.T) {
				graph32 := checkGPU[float32](t, P, m, n, k, pieces, false, 1e-5)
				eager32 := checkGPU[float32](t, P, m, n, k, pieces, true, 1e-5)
				for r := range P {
					if !bytes.Equal(graph32[r], eager32[r]) {
						t.Errorf("rank %d: graph and eager C differ", r)
					}
				}
				checkGPU[float64](t, P, m, n, k, pieces, false, 1e-12)
			})
		}
	}
}

// Across nodes the Op gathers with the communicator's plans as well
// (host-staged through TCP in one process): the same results as on one
// node, graph and eager alike.
func TestGPUOverlapAcrossNodes(t *testing.T) {
	if err := device.CUDAAvailable(); err != nil {
		t.Fatalf("no CUDA library (%v)", err)
	}
	for _, tc := range []struct{ nodes, perNode, m, n, k, pieces int }{
		{2, 1, 37, 19, 53, 3},
		{2, 2, 64, 16, 40, 4},
	} {
		t.Run(fmt.Sprintf("%dx%d/%dx%dx%d", tc.nodes, tc.perNode, tc.m, tc.n, tc.k), func(t *testing.T) {
			checkGPUOn[float32](t, tc.nodes, tc.perNode, tc.m, tc.n, tc.k, tc.pieces, false, 1e-5)
			checkGPUOn[float64](t, tc.nodes, tc.perNode, tc.m, tc.n, tc.k, tc.pieces, true, 1e-12)
		})
	}
}

// TestGPURunAllocs: once planned, a GPU Op's run allocates nothing, on one
// node (its pieces' graphs) and across two (host-staged).
func TestGPURunAllocs(t *testing.T) {
	for _, nodes := range []int{1, 2} {
		t.Run(fmt.Sprintf("nodes%d", nodes), func(t *testing.T) {
			testranks.Run(t, nodes, 2/nodes, func(o *collective.Options) {
				o.Backend, o.GPUScratch, o.Timeout = device.CUDA, 64<<10, 30*time.Second
			}, func(c *collective.Communicator) error {
				ctx := context.Background()
				o, err := NewWith[float32](ctx, c, 40, 8, 16, Options{Pieces: 4, MinPieceBytes: -1})
				if err != nil {
					return err
				}
				defer o.Close()
				a, b := make([]float32, 40*16), make([]float32, 16*8)
				fillRand(a, uint64(c.Rank()*1000))
				fillRand(b, 5)
				if err := o.WriteA(a); err != nil {
					return err
				}
				if err := o.WriteB(b); err != nil {
					return err
				}
				allocs, err := testranks.AllocsPerRun(c, func() error { return o.Run(ctx) })
				if err != nil {
					return err
				}
				if allocs >= 1 {
					return fmt.Errorf("%.1f allocations per run", allocs)
				}
				got := make([]float32, 2*40*8)
				if err := o.ReadC(got); err != nil {
					return err
				}
				if e := relErr(got, reference(2, 40, 8, 16, b, 0)); e > 1e-5 {
					return fmt.Errorf("relative error %g", e)
				}
				return nil
			})
		})
	}
}

// New refuses a negative shape with ErrInvalid on either backend.
func TestOverlapInvalid(t *testing.T) {
	for _, backend := range []device.Kind{device.CUDA, device.CPU} {
		t.Run(backend.String(), func(t *testing.T) {
			testranks.Run(t, 1, 2, func(o *collective.Options) {
				o.Backend, o.GPUScratch = backend, 64<<10
			}, func(c *collective.Communicator) error {
				o, err := New[float32](context.Background(), c, -1, 4, 4, 2)
				if !errors.Is(err, collective.ErrInvalid) {
					if o != nil {
						o.Close()
					}
					return fmt.Errorf("New: %v, want ErrInvalid", err)
				}
				return nil
			})
		})
	}
}

// New picks the communicator's backend: mode "host" on the CPU, the plans'
// mode on CUDA; WriteA, WriteB, ReadC and ReadG work on both and refuse a
// slice of the wrong length.
func TestOverlapBackendChosen(t *testing.T) {
	for _, tc := range []struct {
		backend device.Kind
		eager   bool
		mode    string
	}{
		{device.CPU, false, "host"},
		{device.CUDA, false, "graph"},
		{device.CUDA, true, "eager"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			testranks.Run(t, 1, 2, func(o *collective.Options) {
				o.Backend, o.Eager, o.GPUScratch = tc.backend, tc.eager, 64<<10
			}, func(c *collective.Communicator) error {
				ctx := context.Background()
				const m, n, k = 3, 2, 5
				o, err := New[float64](ctx, c, m, n, k, 2)
				if err != nil {
					return err
				}
				defer o.Close()
				if o.Mode() != tc.mode {
					return fmt.Errorf("mode %q, want %q", o.Mode(), tc.mode)
				}
				if err := o.WriteA(make([]float64, m*k+1)); !errors.Is(err, collective.ErrInvalid) {
					return fmt.Errorf("WriteA of a long slice: %v, want ErrInvalid", err)
				}
				a, b := make([]float64, m*k), make([]float64, k*n)
				fillRand(a, uint64(c.Rank()*1000))
				fillRand(b, 3)
				if err := o.WriteA(a); err != nil {
					return err
				}
				if err := o.WriteB(b); err != nil {
					return err
				}
				if err := o.Run(ctx); err != nil {
					return err
				}
				got := make([]float64, 2*m*n)
				if err := o.ReadC(got); err != nil {
					return err
				}
				if e := relErr(got, reference(2, m, n, k, b, 0)); e > 1e-12 {
					return fmt.Errorf("relative error %g", e)
				}
				return nil
			})
		})
	}
}
