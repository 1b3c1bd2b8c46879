package overlap

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/testranks"
)

// fillInts fills x with random small integers: their products and sums
// are exact in either type, so a GEMM's result does not depend on the
// order its BLAS sums in, and two backends' results compare byte for byte.
func fillInts[T Float](x []T, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 11))
	for i := range x {
		x[i] = T(r.IntN(9) - 4)
	}
}

// TestSameOpBothBackends runs one Op, the same code, on the CPU backend
// and on the CUDA one (the emulator here), on one node and across two, in
// each way of running it (with a shape of no rows too), and checks that C equals Multiply of every
// rank's rows byte for byte on both, and G every rank's rows.
func TestSameOpBothBackends(t *testing.T) {
	for _, backend := range []device.Kind{device.CPU, device.CUDA} {
		for _, tc := range []struct{ nodes, perNode, m, n, k, pieces int }{
			{1, 3, 37, 19, 53, 3},
			{2, 1, 21, 8, 13, 2},
			{1, 2, 5, 3, 0, 2},
			{1, 2, 0, 3, 4, 2}, // no rows: no pieces, no plans
		} {
			t.Run(fmt.Sprintf("%v/%dx%d/%dx%dx%d", backend, tc.nodes, tc.perNode, tc.m, tc.n, tc.k), func(t *testing.T) {
				sameOp[float32](t, backend, tc.nodes, tc.perNode, tc.m, tc.n, tc.k, tc.pieces)
				sameOp[float64](t, backend, tc.nodes, tc.perNode, tc.m, tc.n, tc.k, tc.pieces)
			})
		}
	}
}

func sameOp[T Float](t *testing.T, backend device.Kind, nodes, perNode, m, n, k, pieces int) {
	t.Helper()
	P := nodes * perNode
	testranks.Run(t, nodes, perNode, func(o *collective.Options) {
		o.Backend, o.Timeout, o.GPUScratch = backend, 30*time.Second, 64<<10
	}, func(c *collective.Communicator) error {
		ctx := context.Background()
		if c.Backend() != backend {
			return fmt.Errorf("backend %v, want %v", c.Backend(), backend)
		}
		o, err := NewWith[T](ctx, c, m, n, k, Options{Pieces: pieces, MinPieceBytes: -1})
		if err != nil {
			return err
		}
		defer o.Close()
		if want := map[device.Kind]string{device.CPU: "host", device.CUDA: "graph"}[backend]; nodes == 1 && o.Mode() != want {
			return fmt.Errorf("mode %q, want %q", o.Mode(), want)
		}
		b, a := make([]T, k*n), make([]T, m*k)
		fillInts(b, 5)
		if err := o.WriteB(b); err != nil {
			return err
		}
		C, G := make([]T, P*m*n), make([]T, P*m*k)
		for iter, run := range []func(context.Context) error{o.Run, o.RunSequential, o.Run} {
			fillInts(a, uint64(100*iter+c.Rank()))
			if err := o.WriteA(a); err != nil {
				return err
			}
			if err := run(ctx); err != nil {
				return err
			}
			all := make([]T, P*m*k)
			for r := range P {
				fillInts(all[r*m*k:(r+1)*m*k], uint64(100*iter+r))
			}
			if err := o.ReadC(C); err != nil {
				return err
			}
			if err := o.ReadG(G); err != nil {
				return err
			}
			if !bytes.Equal(asBytes(C), asBytes(Multiply(all, b, P*m, n, k))) {
				return fmt.Errorf("%v, %s mode, run %d: C differs from Multiply", backend, o.Mode(), iter)
			}
			if !bytes.Equal(asBytes(G), asBytes(all)) {
				return fmt.Errorf("%v, %s mode, run %d: G differs from the ranks' rows", backend, o.Mode(), iter)
			}
		}
		return nil
	})
}
