package collective_test

import (
	"regexp"
	"strconv"
	"testing"
)

// TestDeadRankNamedByAll kills one rank during a stream of all-gathers
// across nodes: every survivor's error must name the rank that died, not
// the neighbour whose connection closed when that neighbour gave up (in a
// ring, the ranks beyond the dead one's two neighbours; across nodes in
// hier, the node and rail peers of those that saw it die).
func TestDeadRankNamedByAll(t *testing.T) {
	for _, tc := range []struct {
		algo   string
		nodeOf []int
	}{
		{"ring", []int{0, 1, 2, 3, 4}},
		{"hier", []int{0, 0, 1, 1, 2, 2}},
	} {
		t.Run(tc.algo, func(t *testing.T) {
			const dead = 2
			out, codes := startRanks(t, tc.nodeOf, []string{"SLIME_ALGO=" + tc.algo},
				"--fault", "kill", "--fault-rank", strconv.Itoa(dead), "--fault-size", "4M")
			for r := range out {
				if r == dead {
					continue
				}
				want := regexp.MustCompile(`(?m)^EXPECTED rank ` + strconv.Itoa(r) + `: allgather rank ` + strconv.Itoa(r) + ` peer ` + strconv.Itoa(dead) + `: slimego: peer lost`)
				if !want.MatchString(out[r]) || codes[r] != 3 {
					t.Errorf("rank %d (exit %d) did not name rank %d:\n%s", r, codes[r], dead, out[r])
				}
			}
		})
	}
}
