package collective_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/slimego/slimego/collective"
)

// TestTypedCountsOverflow: AllGatherVOf counts in elements whose bytes
// overflow an int are a bad argument (ErrInvalid on every rank, naming the
// count), not counts of a wrapped size: 2^62 float32s wrapped to 0 bytes,
// and -(2^62) to 0 too, so that every rank "gathered" nothing for that
// rank without an error. Across two nodes (TCP) and within one (shared
// memory); the communicator stays usable.
func TestTypedCountsOverflow(t *testing.T) {
	for _, tc := range []struct {
		name  string
		count int
	}{
		{"2^62", 1 << 62},
		{"-2^62", -(1 << 62)},
		{"2^62+1", 1<<62 + 1},
		{"maxint", math.MaxInt},
	} {
		for _, nodes := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s/%dnodes", tc.name, nodes), func(t *testing.T) {
				inProcessNodes(t, nodes, 2/nodes, nil, func(c *collective.Communicator) error {
					ctx := context.Background()
					counts := []int{tc.count, 1}
					src := make([]float32, 0)
					if c.Rank() == 1 {
						src = []float32{7}
					}
					dst := make([]float32, 1)
					err := collective.AllGatherVOf(ctx, c, dst, src, counts)
					if !errors.Is(err, collective.ErrInvalid) || !strings.Contains(err.Error(), "for rank 0") {
						return fmt.Errorf("rank %d: counts %v of float32: err = %v; want ErrInvalid naming rank 0's count", c.Rank(), counts, err)
					}
					b := make([]byte, 2*3)
					if err := c.AllGather(ctx, b, []byte{1, 2, 3}); err != nil {
						return fmt.Errorf("rank %d: the next call: %v", c.Rank(), err)
					}
					return nil
				})
			})
		}
	}
}
