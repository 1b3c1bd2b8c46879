package intra

import (
	"fmt"
	"strings"
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

// TestFollowBlameSelf: a peer that gave up the call on this rank (it
// waited past its timeout for this one, the late rank) is named, and the
// account says that it gave up on this rank: "an error of its own" alone
// read as if the peer were at fault.
func TestFollowBlameSelf(t *testing.T) {
	errs := group(t, 2, Config{Timeout: 10 * time.Second}, func(g *Group) error {
		if g.Rank() != 0 {
			return nil
		}
		atomic.StoreUint32(&g.ctrls[1].blame, uint32(g.global(0))+1) // 1 gave up on 0
		why, who := g.follow(1, "peer abandoned the operation after an error of its own")
		if who != g.global(1) {
			return fmt.Errorf("1 blaming this rank: names rank %d, want 1", who)
		}
		if !strings.Contains(why, "gave up the call on this rank") {
			return fmt.Errorf("1 blaming this rank: the account %q does not say that it gave up on this rank", why)
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}
