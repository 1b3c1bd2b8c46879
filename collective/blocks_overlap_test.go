package collective_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/internal/pattern"
	"github.com/slimego/slimego/internal/testranks"
)

// TestPlanBlocksOverlap: blocks that share bytes of the destination would
// leave there whichever arrived last, other bytes on each rank (and an
// in-place source overwritten while the peers read it): PlanBlocks
// refuses them with ErrInvalid naming both ranks. Blocks apart, with gaps
// between them, out of rank order, and empty ones anywhere, gather
// byte for byte. Within a node and across nodes.
func TestPlanBlocksOverlap(t *testing.T) {
	const n = 10_000
	for _, shape := range [][2]int{{1, 3}, {3, 1}} {
		t.Run(fmt.Sprintf("%dx%d", shape[0], shape[1]), func(t *testing.T) {
			testranks.Run(t, shape[0], shape[1], nil, func(c *collective.Communicator) error {
				ctx := context.Background()
				me := c.Rank()
				dst := make([]byte, 4*n)
				for _, bad := range []struct {
					what       string
					offs       []int
					sizes      []int
					rankA, rnB int
				}{
					{"one byte shared", []int{0, n - 1, 3 * n}, []int{n, n, n}, 0, 1},
					{"one block inside another", []int{0, 3 * n, 10}, []int{3 * n, n, n}, 0, 2},
					{"the same place", []int{n, n, 3 * n}, []int{n, n, n}, 0, 1},
				} {
					src := dst[bad.offs[me] : bad.offs[me]+bad.sizes[me]] // in place
					p, err := c.PlanBlocks(dst, src, bad.sizes, bad.offs)
					if p != nil {
						p.Close()
					}
					var oe *collective.OpError
					if !errors.Is(err, collective.ErrInvalid) || !errors.As(err, &oe) || oe.Rank != me ||
						!strings.Contains(err.Error(), fmt.Sprintf("ranks %d ", bad.rankA)) || !strings.Contains(err.Error(), fmt.Sprintf(" %d (", bad.rnB)) {
						return fmt.Errorf("%s: %v, want ErrInvalid naming ranks %d and %d", bad.what, err, bad.rankA, bad.rnB)
					}
				}
				// Apart, out of order, with gaps; rank 1's block empty, at
				// rank 0's offset.
				sizes, offs := []int{n, 0, n}, []int{2*n + 5, 2*n + 5, 3}
				src := make([]byte, sizes[me])
				pattern.Fill(src, pattern.Seed(me, 0, 0))
				p, err := c.PlanBlocks(dst, src, sizes, offs)
				if err != nil {
					return fmt.Errorf("blocks apart: %w", err)
				}
				defer p.Close()
				if err := p.Run(ctx); err != nil {
					return err
				}
				for r := range 3 {
					if i := pattern.Check(dst[offs[r]:offs[r]+sizes[r]], pattern.Seed(r, 0, 0)); i >= 0 {
						return fmt.Errorf("blocks apart: rank %d's block wrong at %d", r, i)
					}
				}
				return nil
			})
		})
	}
}
