package overlap_test

import (
	"context"
	"fmt"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/overlap"
)

// Two ranks of one node, as goroutines of this process, each holding 2 rows
// of A; every rank gets the whole 4 × 2 product C = AllGather(A)·B.
func ExampleNewWith() {
	ctx := context.Background()
	errs := collective.RunInProcess(ctx, 1, 2, nil, func(c *collective.Communicator) error {
		const m, n, k = 2, 2, 3
		op, err := overlap.NewWith[float64](ctx, c, m, n, k, overlap.Options{Pieces: 2})
		if err != nil {
			return err
		}
		defer op.Close()
		a := make([]float64, m*k) // rank r's rows: r+1 everywhere
		for i := range a {
			a[i] = float64(c.Rank() + 1)
		}
		if err := op.WriteA(a); err != nil {
			return err
		}
		if err := op.WriteB([]float64{1, 0, 0, 1, 1, 1}); err != nil { // B = [[1 0] [0 1] [1 1]]
			return err
		}
		if err := op.Run(ctx); err != nil {
			return err
		}
		C := make([]float64, c.Size()*m*n)
		if err := op.ReadC(C); err != nil {
			return err
		}
		if c.Rank() == 0 {
			fmt.Println(op.Pieces(), "pieces; C =", C)
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			fmt.Println("rank", r, err)
		}
	}
	// Output: 2 pieces; C = [2 2 2 2 4 4 4 4]
}
