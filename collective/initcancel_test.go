package collective_test

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
)

// TestInitCancelled: Init given a context cancelled before the call fails
// with context.Canceled, not ErrTimeout: the store's dial gave up on the
// cancelled context and was reported as a store unreachable within the
// deadline ("tried for 0s"), a timeout.
func TestInitCancelled(t *testing.T) {
	for _, P := range []int{1, 2} {
		t.Run(fmt.Sprintf("P=%d", P), func(t *testing.T) {
			j := slimerun(t, []string{"SLIME_TIMEOUT=20"}, "--monitor-interval", "15s", "--nproc-per-node", fmt.Sprint(P),
				"agcheck", "--fault", "init-cancelled", "--fault-rank", "0")
			if !regexp.MustCompile(`(?m)^\[0\]: EXPECTED rank 0: init rank 0: context canceled`).MatchString(j.out) || strings.Contains(j.out, "UNEXPECTED") {
				t.Errorf("exit %d; want rank 0's Init to fail with context.Canceled:\n%s\n%s", j.code, j.out, j.stderr)
			}
		})
	}
}
