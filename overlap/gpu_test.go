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
	var mu sync.Mutex
	out := make([][]byte, P)
	testranks.Run(t, 1, P, func(o *collective.Options) {
		// A small scratch block: every emulated allocation is shared host
		// memory.
		o.Backend, o.Eager, o.Timeout, o.GPUScratch = device.CUDA, eager, 30*time.Second, 64<<10
	}, func(c *collective.Communicator) error {
		ctx := context.Background()
		o, err := NewGPU[T](ctx, c, m, n, k, pieces)
		if err != nil {
			return err
		}
		defer o.Close()
		a, b, cHost := make([]T, m*k), make([]T, k*n), make([]T, P*m*n)
		fillRand(b, 99)
		if err := o.B.CopyFromHost(gpuBytes(b)); err != nil {
			return err
		}
		for iter := range 4 {
			fillRand(a, uint64(c.Rank()*1000+iter))
			if err := o.A.CopyFromHost(gpuBytes(a)); err != nil {
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
			if err := o.C.CopyToHost(gpuBytes(cHost)); err != nil {
				return err
			}
			if e := relErr(cHost, reference(P, m, n, k, b, iter)); e > tol {
				return fmt.Errorf("%s mode, iteration %d: relative error %.3g > %.3g", o.Mode(), iter, e, tol)
			}
			if iter == 2 {
				g, want := make([]T, P*m*k), make([]T, P*m*k)
				if err := o.G.CopyToHost(gpuBytes(g)); err != nil {
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

// NewGPU refuses a negative shape and a communicator on the CPU backend,
// with ErrInvalid.
func TestGPUOverlapInvalid(t *testing.T) {
	for _, tc := range []struct {
		name    string
		backend device.Kind
		m       int
	}{
		{"negative shape", device.CUDA, -1},
		{"cpu communicator", device.CPU, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testranks.Run(t, 1, 2, func(o *collective.Options) {
				o.Backend, o.GPUScratch = tc.backend, 64<<10
			}, func(c *collective.Communicator) error {
				o, err := NewGPU[float32](context.Background(), c, tc.m, 4, 4, 2)
				if !errors.Is(err, collective.ErrInvalid) {
					if o != nil {
						o.Close()
					}
					return fmt.Errorf("NewGPU: %v, want ErrInvalid", err)
				}
				return nil
			})
		})
	}
}
