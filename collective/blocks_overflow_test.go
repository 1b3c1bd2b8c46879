package collective_test

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/internal/testranks"
)

// TestPlanBlocksOverflow: PlanBlocks on byte slices checks every block's
// bounds without computing offset+size, which wraps for huge values: a
// block that cannot fit is ErrInvalid naming the rank (not a plan that
// slices out of range), within a node and across nodes.
func TestPlanBlocksOverflow(t *testing.T) {
	for _, shape := range [][2]int{{1, 2}, {2, 1}} {
		t.Run(fmt.Sprintf("%dx%d", shape[0], shape[1]), func(t *testing.T) {
			testranks.Run(t, shape[0], shape[1], nil, func(c *collective.Communicator) error {
				dst := make([]byte, 64)
				src := dst[32*c.Rank() : 32*c.Rank()+32]
				for _, bad := range [][2]int{{math.MaxInt, 16}, {1, math.MaxInt}, {math.MaxInt - 8, 16}} {
					sizes, offs := make([]int, 2), make([]int, 2)
					sizes[c.Rank()], offs[c.Rank()] = 32, 32*c.Rank()
					sizes[1-c.Rank()], offs[1-c.Rank()] = bad[0], bad[1]
					p, err := c.PlanBlocks(dst, src, sizes, offs)
					if p != nil {
						p.Close()
					}
					var oe *collective.OpError
					if !errors.Is(err, collective.ErrInvalid) || !errors.As(err, &oe) || oe.Rank != c.Rank() {
						return fmt.Errorf("block of %d bytes at %d in 64: %v, want ErrInvalid naming rank %d", bad[0], bad[1], err, c.Rank())
					}
				}
				return nil
			})
		})
	}
}
