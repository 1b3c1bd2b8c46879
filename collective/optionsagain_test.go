package collective_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/slimego/slimego/collective"
)

// TestInitWithOptionsOfCommunicator: the options a communicator reports
// (Options: "the options the communicator runs with") make a second
// communicator of the job under another name, as a framework that opens
// a subgroup from its world's options does: on one node (whose algorithm
// Options reports as "intra") as across nodes. Each gathers random bytes,
// checked byte for byte, beside the first.
func TestInitWithOptionsOfCommunicator(t *testing.T) {
	for _, lay := range []struct{ nodes, perNode int }{{1, 1}, {1, 3}, {2, 2}} {
		t.Run(fmt.Sprintf("%dx%d", lay.nodes, lay.perNode), func(t *testing.T) {
			inProcessNodes(t, lay.nodes, lay.perNode, nil, func(c *collective.Communicator) error {
				ctx := context.Background()
				o := c.Options()
				o.Name = "sub"
				c2, err := collective.Init(ctx, o)
				if err != nil {
					return fmt.Errorf("rank %d: Init with the communicator's own Options (Algo %q): %v", c.Rank(), c.Options().Algo, err)
				}
				defer c2.Close()
				for it := range 3 {
					if err := checkGather(ctx, c2, 4099+it, 40+it); err != nil {
						return err
					}
					if err := checkGather(ctx, c, 7+it, 50+it); err != nil {
						return err
					}
				}
				return nil
			})
		})
	}
}
