package collective_test

import (
	"regexp"
	"strconv"
	"testing"
)

// TestDeadRankNamedByAll kills one rank during a stream of all-gathers
// across nodes, or makes it late: every other rank's error must name that
// rank, not the neighbour whose connection closed when that neighbour gave
// up, or whom it waited for (in a ring, the ranks beyond the culprit's two
// neighbours; across nodes in hier, the node and rail peers of those that
// saw it).
func TestDeadRankNamedByAll(t *testing.T) {
	for _, tc := range []struct {
		name, algo, fault string
		nodeOf            []int
	}{
		{"ring", "ring", "kill", []int{0, 1, 2, 3, 4}},
		{"hier", "hier", "kill", []int{0, 0, 1, 1, 2, 2}},
		// Rank 2 comes late: every other rank's wait times out at about
		// the same moment, each waiting for its own predecessor.
		{"ring/slow", "ring", "slow", []int{0, 1, 2, 3, 4}},
		{"hier/slow", "hier", "slow", []int{0, 0, 1, 1, 2, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const culprit = 2
			out, codes := startRanks(t, tc.nodeOf, []string{"SLIME_ALGO=" + tc.algo, "SLIME_TIMEOUT=3"},
				"--fault", tc.fault, "--fault-rank", strconv.Itoa(culprit), "--fault-size", "4M")
			for r := range out {
				if r == culprit {
					continue
				}
				want := regexp.MustCompile(`(?m)^EXPECTED rank ` + strconv.Itoa(r) + `: allgather rank ` + strconv.Itoa(r) + ` peer ` + strconv.Itoa(culprit) + `: slimego: (peer lost|timeout)`)
				if !want.MatchString(out[r]) || codes[r] != 3 {
					t.Errorf("rank %d (exit %d) did not name rank %d:\n%s", r, codes[r], culprit, out[r])
				}
			}
		})
	}
}
