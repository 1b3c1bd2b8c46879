package collective_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/slimego/slimego/collective"
)

// An error of AllGatherV names allgatherv, and one of AllGather names
// allgather, whichever of the two the communicator ran first: within a
// node (shared memory) and across nodes (TCP).
func TestOneShotErrorNamesItsOperation(t *testing.T) {
	for _, layout := range [][2]int{{1, 2}, {2, 1}} {
		for _, first := range []string{"allgather", "allgatherv"} {
			t.Run(fmt.Sprintf("%dx%d/%s-first", layout[0], layout[1], first), func(t *testing.T) {
				inProcessNodes(t, layout[0], layout[1], nil, func(c *collective.Communicator) error {
					ctx := context.Background()
					P := c.Size()
					counts := make([]int, P)
					for i := range counts {
						counts[i] = 4
					}
					gather := func() error { return c.AllGather(ctx, make([]byte, 4*P), make([]byte, 4)) }
					gatherV := func() error { return c.AllGatherV(ctx, make([]byte, 4*P), make([]byte, 4), counts) }
					// Then, on every rank, a source of the wrong length.
					badV := func() error { return c.AllGatherV(ctx, make([]byte, 4*P), make([]byte, 3), counts) }
					if first == "allgather" {
						if err := gather(); err != nil {
							return err
						}
					} else if err := gatherV(); err != nil {
						return err
					}
					err := badV()
					var oe *collective.OpError
					if !errors.Is(err, collective.ErrInvalid) || !errors.As(err, &oe) || oe.Op != "allgatherv" {
						return fmt.Errorf("rank %d: AllGatherV with a 3-byte source for a 4-byte block: %v, want ErrInvalid from allgatherv", c.Rank(), err)
					}
					// A mismatch: rank 0 passes other counts than the rest.
					mine := append([]int(nil), counts...)
					if c.Rank() == 0 {
						mine[0] = 5
					}
					err = c.AllGatherV(ctx, make([]byte, 4*P+1), make([]byte, mine[c.Rank()]), mine)
					if !errors.Is(err, collective.ErrSizeMismatch) || !errors.As(err, &oe) || oe.Op != "allgatherv" {
						return fmt.Errorf("rank %d: AllGatherV with rank 0's counts differing: %v, want ErrSizeMismatch from allgatherv", c.Rank(), err)
					}
					// And back: AllGather after AllGatherV is named allgather.
					n := 4
					if c.Rank() == 0 {
						n = 5
					}
					err = c.AllGather(ctx, make([]byte, n*P), make([]byte, n))
					if !errors.Is(err, collective.ErrSizeMismatch) || !errors.As(err, &oe) || oe.Op != "allgather" {
						return fmt.Errorf("rank %d: AllGather with rank 0's size differing: %v, want ErrSizeMismatch from allgather", c.Rank(), err)
					}
					if err := gather(); err != nil {
						return err
					}
					return gatherV()
				})
			})
		}
	}
}
