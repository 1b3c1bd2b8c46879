package collective_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/internal/pattern"
)

// TestAllocAgainstOtherCall: the ranks' calls differ in order, one
// rank's an Alloc (which meets its peers through the store), the other's
// an AllGather or a Barrier (which meet in shared memory). Every rank
// returns ErrSizeMismatch naming the other and both calls at once, not
// each its own timeout (20 s) waiting where the other never comes; the
// communicator stays usable.
func TestAllocAgainstOtherCall(t *testing.T) {
	const n = 4096
	for _, other := range []string{"allgather", "barrier"} {
		t.Run(other, func(t *testing.T) {
			inProcess(t, 2, func(c *collective.Communicator) error {
				ctx := context.Background()
				me := c.Rank()
				start := time.Now()
				var err error
				if me == 1 {
					_, err = c.Alloc(ctx, n)
				} else if other == "barrier" {
					err = c.Barrier(ctx)
				} else {
					err = c.AllGather(ctx, make([]byte, 2*n), make([]byte, n))
				}
				took := time.Since(start)
				var oe *collective.OpError
				if !errors.Is(err, collective.ErrSizeMismatch) || !errors.As(err, &oe) || oe.Peer != 1-me ||
					!strings.Contains(err.Error(), "alloc") || !strings.Contains(err.Error(), other) {
					return fmt.Errorf("alloc against %s: %v (after %v), want ErrSizeMismatch naming rank %d and both calls", other, err, took.Round(time.Millisecond), 1-me)
				}
				if took > 5*time.Second {
					return fmt.Errorf("the mismatch took %v: %v", took, err)
				}
				b, err := c.Alloc(ctx, n)
				if err != nil {
					return fmt.Errorf("the Alloc after: %w", err)
				}
				defer b.Free()
				pattern.Fill(b.Bytes(), pattern.Seed(me, 0, 0))
				dst := make([]byte, 2*n)
				if err := c.AllGather(ctx, dst, b.Bytes()); err != nil {
					return fmt.Errorf("the gather after: %w", err)
				}
				for r := range 2 {
					if i := pattern.Check(dst[r*n:r*n+n], pattern.Seed(r, 0, 0)); i >= 0 {
						return fmt.Errorf("the gather after: rank %d's block wrong at %d", r, i)
					}
				}
				return nil
			})
		})
	}
}
