package overlap

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/internal/testranks"
)

// ranks runs body on P in-process ranks of one node.
func ranks(t *testing.T, P int, body func(c *collective.Communicator) error) {
	t.Helper()
	testranks.Run(t, 1, P, nil, body)
}

func fillRand[T Float](x []T, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 7))
	for i := range x {
		x[i] = T(r.Float64()*2 - 1)
	}
}

// reference computes the full product from every rank's regenerated A.
func reference[T Float](P, m, n, k int, b []T, iter int) []T {
	a := make([]T, P*m*k)
	for r := range P {
		fillRand(a[r*m*k:(r+1)*m*k], uint64(r*1000+iter))
	}
	return Multiply(a, b, P*m, n, k)
}

// relErr is ‖got − want‖_F / ‖want‖_F.
func relErr[T Float](got, want []T) float64 {
	var num, den float64
	for i := range want {
		d := float64(got[i]) - float64(want[i])
		num += d * d
		den += float64(want[i]) * float64(want[i])
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}

func check[T Float](t *testing.T, P, m, n, k, pieces int, tol float64) {
	checkOn[T](t, 1, P, m, n, k, Options{Pieces: pieces}, pieces, tol)
}

// checkOn runs the operator made with opts on nodes × perNode in-process
// ranks and checks every iteration's C against the reference, and that the
// gather was cut into cut pieces (fewer where m is smaller).
func checkOn[T Float](t *testing.T, nodes, perNode, m, n, k int, opts Options, cut int, tol float64) {
	P := nodes * perNode
	testranks.Run(t, nodes, perNode, nil, func(c *collective.Communicator) error {
		ctx := context.Background()
		o, err := NewWith[T](ctx, c, m, n, k, opts)
		if err != nil {
			return err
		}
		defer o.Close()
		if want := min(cut, max(m, 1)); o.Pieces() != want && m > 0 {
			return fmt.Errorf("the gather is cut into %d pieces, want %d", o.Pieces(), want)
		}
		a, b, got := make([]T, m*k), make([]T, k*n), make([]T, P*m*n)
		fillRand(b, 99)
		if err := o.WriteB(b); err != nil {
			return err
		}
		for it := range 3 {
			fillRand(a, uint64(c.Rank()*1000+it))
			if err := o.WriteA(a); err != nil {
				return err
			}
			run := o.Run
			if it == 2 {
				run = o.RunSequential
			}
			if err := run(ctx); err != nil {
				return err
			}
			if err := o.ReadC(got); err != nil {
				return err
			}
			if e := relErr(got, reference(P, m, n, k, b, it)); e > tol {
				return fmt.Errorf("iteration %d: relative error %g > %g", it, e, tol)
			}
		}
		return nil
	})
}

// TestOverlapAcrossNodes: across nodes a gather piece carries at least
// MinPieceBytes per rank (2 MiB with the default 4 connections), so a block
// of 4.4 MB is cut into 2 pieces however many are asked for, a small one
// into 1, unless Options set a smaller least or none; the results are
// right either way.
func TestOverlapAcrossNodes(t *testing.T) {
	for _, tc := range []struct{ nodes, perNode, m, n, k, pieces, min, cut int }{
		{2, 1, 1030, 19, 1070, 4, 0, 2},
		{2, 2, 1030, 19, 1070, 4, 0, 2},
		{2, 1, 37, 29, 45, 3, 0, 1},
		{2, 1, 1030, 19, 1070, 1, 0, 1},
		{2, 1, 1030, 19, 1070, 8, 1 << 20, 4}, // 4.4 MB in pieces of at least 1 MiB
		{2, 2, 37, 29, 45, 3, -1, 3},          // no least
		{2, 1, 1030, 19, 1070, 0, -1, DefaultPieces},
	} {
		t.Run(fmt.Sprintf("%dx%d/%dx%dx%d/pieces%d/min%d", tc.nodes, tc.perNode, tc.m, tc.n, tc.k, tc.pieces, tc.min), func(t *testing.T) {
			checkOn[float32](t, tc.nodes, tc.perNode, tc.m, tc.n, tc.k, Options{Pieces: tc.pieces, MinPieceBytes: tc.min}, tc.cut, 1e-5)
		})
	}
}

// TestRunAllocs: once planned, an overlapped run allocates nothing, on one
// node and across two (the gather's pieces, the events between the
// streams, the GEMMs).
func TestRunAllocs(t *testing.T) {
	for _, nodes := range []int{1, 2} {
		t.Run(fmt.Sprintf("nodes%d", nodes), func(t *testing.T) {
			testranks.Run(t, nodes, 2/nodes, nil, func(c *collective.Communicator) error {
				ctx := context.Background()
				o, err := NewWith[float32](ctx, c, 40, 8, 16, Options{Pieces: 4, MinPieceBytes: -1})
				if err != nil {
					return err
				}
				defer o.Close()
				a, b, got := make([]float32, 40*16), make([]float32, 16*8), make([]float32, 2*40*8)
				fillRand(a, uint64(c.Rank()*1000)) // as reference's iteration 0
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

func TestOverlapCorrect(t *testing.T) {
	shapes := [][3]int{{37, 29, 45}, {1, 1, 1}, {64, 17, 3}, {5, 0, 7}, {0, 9, 4}, {9, 8, 0}}
	for _, P := range []int{1, 2, 3, 4} {
		for _, s := range shapes {
			for _, pieces := range []int{1, 3} {
				t.Run(fmt.Sprintf("P%d/%dx%dx%d/pieces%d", P, s[0], s[1], s[2], pieces), func(t *testing.T) {
					check[float32](t, P, s[0], s[1], s[2], pieces, 1e-5)
					check[float64](t, P, s[0], s[1], s[2], pieces, 1e-12)
				})
			}
		}
	}
}

// A peer that leaves during an overlapped run makes every rank's run fail
// (no hang).
func TestOverlapPeerLost(t *testing.T) {
	ranks(t, 3, func(c *collective.Communicator) error {
		ctx := context.Background()
		o, err := New[float32](ctx, c, 256, 64, 64, 4)
		if err != nil {
			return err
		}
		defer o.Close()
		if err := o.Run(ctx); err != nil {
			return err
		}
		if c.Rank() == 1 {
			return nil // leaves: Close via ranks()
		}
		start := time.Now()
		for time.Since(start) < 10*time.Second {
			if err := o.Run(ctx); err != nil {
				if !errors.Is(err, collective.ErrPeerLost) && !errors.Is(err, collective.ErrTimeout) {
					return fmt.Errorf("want ErrPeerLost, got %v", err)
				}
				return nil
			}
		}
		return fmt.Errorf("runs kept succeeding after rank 1 left")
	})
}
