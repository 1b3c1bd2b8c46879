package collective_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/internal/pattern"
)

// TestSrcOverlapRefused: a source that overlaps the destination other
// than at this rank's own block (here one byte past it, so that it
// reaches into the next rank's block) is ErrInvalid on the rank that
// passed it and on every other (naming it), whatever the engine: on one
// node, hierarchical, and the ring across nodes (uneven nodes, or
// SLIME_ALGO=ring), for AllGather, AllGatherV and a Plan's run; nothing
// moves, and the next call gathers random bytes right, checked byte for
// byte. (The ring took such a source and returned nil on every rank,
// each rank reading the odd block from memory that the gather wrote.)
func TestSrcOverlapRefused(t *testing.T) {
	for _, lay := range []struct {
		name           string
		nodes, perNode int
		algo           string
	}{{"1x3", 1, 3, ""}, {"2x2-hier", 2, 2, "hier"}, {"2x2-ring", 2, 2, "ring"}, {"3x1-ring", 3, 1, "ring"}} {
		t.Run(lay.name, func(t *testing.T) {
			tune := func(o *collective.Options) { o.Algo = lay.algo }
			inProcessNodes(t, lay.nodes, lay.perNode, tune, func(c *collective.Communicator) error {
				ctx := context.Background()
				P, me := c.Size(), c.Rank()
				const odd, n = 1, 4099
				for it, call := range []string{"allgather", "allgatherv", "plan"} {
					dst := make([]byte, P*n+1)
					src := make([]byte, n)
					if me == odd {
						src = dst[odd*n+1 : odd*n+1+n] // overlaps the own block and the next one
					}
					pattern.Fill(src, pattern.Seed(me, it, 3))
					counts := make([]int, P)
					for r := range counts {
						counts[r] = n
					}
					var err error
					switch call {
					case "allgather":
						err = c.AllGather(ctx, dst, src)
					case "allgatherv":
						err = c.AllGatherV(ctx, dst, src, counts)
					case "plan":
						var p *collective.Plan
						if p, err = c.Plan(dst, src); err == nil {
							err = p.Run(ctx)
							p.Close()
						} else if me == odd {
							// Refused at planning, this rank's alone: the peers'
							// run takes part with it as a refused call.
							err = c.AllGather(ctx, dst, src)
						}
					}
					if !errors.Is(err, collective.ErrInvalid) {
						wrong := ""
						if err == nil {
							if i := pattern.Check(dst[odd*n:odd*n+n], pattern.Seed(odd, it, 3)); i >= 0 {
								wrong = fmt.Sprintf(" (rank %d's block wrong here from byte %d)", odd, i)
							}
						}
						return fmt.Errorf("rank %d: %s with rank %d's source overlapping the destination: %v%s, want ErrInvalid", me, call, odd, err, wrong)
					}
					if !strings.Contains(err.Error(), "overlaps the destination") {
						return fmt.Errorf("rank %d: %s: %v, want it to say the source overlaps the destination", me, call, err)
					}
					if err := checkGather(ctx, c, 1000+it, 60+it); err != nil {
						return err
					}
				}
				return nil
			})
		})
	}
}
