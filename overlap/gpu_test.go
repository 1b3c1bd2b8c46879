package overlap

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/testranks"
)

func gpuBytes[T Float](s []T) []byte { return asBytes(s) }

// checkGPU runs the GPU operator on P in-process ranks, three times with
// fresh A, against the reference GEMM; it returns every rank's last C.
func checkGPU[T Float](t *testing.T, P, m, n, k, pieces int, eager bool, tol float64) [][]byte {
	t.Helper()
	var mu sync.Mutex
	out := make([][]byte, P)
	testranks.Run(t, 1, P, func(o *collective.Options) {
		o.Backend, o.Eager, o.Timeout = device.CUDA, eager, 30*time.Second
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
		for iter := range 3 {
			fillRand(a, uint64(c.Rank()*1000+iter))
			if err := o.A.CopyFromHost(gpuBytes(a)); err != nil {
				return err
			}
			run := o.Run
			if iter == 1 {
				run = o.RunSequential
			}
			if err := run(ctx); err != nil {
				return err
			}
			if err := o.C.CopyToHost(gpuBytes(cHost)); err != nil {
				return err
			}
			if e := relErr(cHost, reference(P, m, n, k, b, iter)); e > tol {
				return fmt.Errorf("%s mode, iteration %d: relative error %.3g > %.3g", o.Mode(), iter, e, tol)
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
		t.Skipf("skipped: no GPU here (%v); runs where libslimecuda.so and a GPU are present (make device-check)", err)
	}
	for _, P := range []int{1, 2, 3, 4} {
		for _, sh := range [][4]int{{37, 19, 53, 3}, {64, 64, 256, 4}, {1, 7, 1, 1}} {
			m, n, k, pieces := sh[0], sh[1], sh[2], sh[3]
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
