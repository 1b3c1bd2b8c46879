package collective_test

import (
	"fmt"
	"regexp"
	"testing"
)

// TestLateRankNamedAtInit: rank 1 of three comes to Init after the
// others' timeout. The first of ranks 0 and 2 to time out waiting for it
// exits; the launcher then fails the other's waits at once, naming the
// rank that exited. Both must name rank 1, whom the exited rank gave up
// on (its blame in the store), not each other. Which one exits first
// varies, so the job runs a few times.
func TestLateRankNamedAtInit(t *testing.T) {
	for i := range 5 {
		// The launcher's next tick after the exit stops the workers: the
		// survivor has until then to report.
		j := slimerun(t, []string{"SLIME_TIMEOUT=2"}, "--monitor-interval", "4s", "--nproc-per-node", "3", "agcheck",
			"--sizes", "0,4096", "--iters", "1", "--fault-rank", "1", "--init-delay", "5s")
		if j.code == 0 {
			t.Fatalf("run %d: the job passed with a rank late to Init:\n%s\n%s", i, j.out, j.stderr)
		}
		for _, r := range []int{0, 2} {
			want := regexp.MustCompile(fmt.Sprintf(`(?m)^\[%d\]: init: init rank %d peer 1: `, r, r))
			if !want.MatchString(j.stderr) {
				t.Errorf("run %d: rank %d did not name rank 1:\n%s", i, r, j.stderr)
			}
		}
	}
}
