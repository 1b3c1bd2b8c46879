package intra

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// TestFollowBlameCycle: ranks that blame each other (two that timed out
// on one another) end the walk along the blames at the first rank seen
// again, so that the rank named does not depend on how many ranks the
// group has; a chain without a cycle ends at the rank that blames none.
func TestFollowBlameCycle(t *testing.T) {
	for _, L := range []int{3, 4} {
		errs := group(t, L, Config{Timeout: 10 * time.Second}, func(g *Group) error {
			if g.Rank() != 0 {
				return nil
			}
			blame := func(r, on int) { atomic.StoreUint32(&g.ctrls[r].blame, uint32(g.global(on))+1) }
			blame(1, 2) // 1 and 2 gave up on each other
			blame(2, 1)
			if _, who := g.follow(1, "gave up"); who != g.global(2) {
				return fmt.Errorf("%d ranks, 1 and 2 blaming each other: waiting for 1 names rank %d, want 2 (1's account)", L, who)
			}
			if L < 4 {
				return nil
			}
			blame(2, 3) // a chain: 1 blames 2, 2 blames 3, 3 none
			if _, who := g.follow(1, "gave up"); who != g.global(3) {
				return fmt.Errorf("the chain 1 → 2 → 3 names rank %d, want 3", who)
			}
			return nil
		})
		for r, err := range errs {
			if err != nil {
				t.Errorf("rank %d: %v", r, err)
			}
		}
	}
}
