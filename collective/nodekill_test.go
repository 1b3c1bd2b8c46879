package collective_test

import (
	"fmt"
	"regexp"
	"strconv"
	"testing"
)

// TestDeadRankNamedOnNode kills one rank of a node during a stream of
// all-gathers: every other rank's error must name it, also the ranks that
// were waiting for a peer that gave up on it first (which marks itself
// failed in the shared memory before they see the death themselves). The
// race is won by a different rank each time, so the job runs a few times,
// with blocks read in place (cross-memory attach) and through the staging
// ring.
func TestDeadRankNamedOnNode(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  []string
	}{
		{"cma", nil},
		{"staged", []string{"SLIME_CMA_MIN=-1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const culprit = 1
			for i := range 4 {
				out, codes := startRanks(t, []int{0, 0, 0, 0, 0, 0}, append([]string{"SLIME_TIMEOUT=10"}, tc.env...),
					"--fault", "kill", "--fault-rank", strconv.Itoa(culprit), "--fault-size", "1M")
				for r := range out {
					if r == culprit {
						continue
					}
					want := regexp.MustCompile(fmt.Sprintf(`(?m)^EXPECTED rank %d: allgather rank %d peer %d: slimego: peer lost`, r, r, culprit))
					if !want.MatchString(out[r]) || codes[r] != 3 {
						t.Errorf("run %d: rank %d (exit %d) did not name rank %d:\n%s", i, r, codes[r], culprit, out[r])
					}
				}
			}
		})
	}
}

// TestStoppedRankNamedOnNode stops one rank of a node (SIGSTOP, continued
// after the others' timeout) while blocks move through the staging rings:
// its peers wait for chunks from owners whose rings the stopped rank no
// longer frees, and every one of them must name the stopped rank, not the
// owner it waited for.
func TestStoppedRankNamedOnNode(t *testing.T) {
	const culprit = 3
	for i := range 3 {
		out, codes := startRanks(t, []int{0, 0, 0, 0}, []string{"SLIME_TIMEOUT=2", "SLIME_CMA_MIN=-1"},
			"--fault", "stop", "--fault-rank", strconv.Itoa(culprit), "--fault-size", "4M")
		for r := range out {
			if r == culprit {
				continue
			}
			want := regexp.MustCompile(fmt.Sprintf(`(?m)^EXPECTED rank %d: allgather rank %d peer %d: slimego: (timeout|peer lost)`, r, r, culprit))
			if !want.MatchString(out[r]) || codes[r] != 3 {
				t.Errorf("run %d: rank %d (exit %d) did not name rank %d:\n%s", i, r, codes[r], culprit, out[r])
			}
		}
	}
}
