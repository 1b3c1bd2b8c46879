package launcher

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/testbin"
)

// TestSessionMembersStopped: a worker leads a session as well as a
// process group; a descendant that moves to a group of its own within
// that session (a script's job control, bash's set -m) is still the
// job's. It is stopped as what a worker leaves in its group is: after a
// success with a warning, after a failure with the others. A launcher
// that signalled only the workers' groups left it running for good.
func TestSessionMembersStopped(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail bool
	}{{"success", false}, {"failure", true}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			// Rank 0 starts a background sleep in a group of its own;
			// rank 1 exits (3 where the case fails) once it has.
			script := `if [ $RANK = 0 ]; then exec bash -c 'set -m; sleep 600 & echo $! > ` + dir + `/bg.tmp; mv ` + dir + `/bg.tmp ` + dir + `/bg; ` + map[bool]string{false: "exit 0", true: "while :; do sleep 0.05; done"}[tc.fail] + `'; fi
while [ ! -e ` + dir + `/bg ]; do sleep 0.01; done
exit ` + map[bool]string{false: "0", true: "3"}[tc.fail]
			_, stderr, err := run(t, Config{NProcPerNode: 2, StopGrace: time.Second}, script)
			if tc.fail {
				var we *WorkerError
				if !errors.As(err, &we) || we.Rank != 1 || we.ExitCode != 3 {
					t.Fatalf("err = %v; want rank 1's exit 3\n%s", err, stderr)
				}
			} else {
				if err != nil {
					t.Fatalf("err = %v\n%s", err, stderr)
				}
				if !strings.Contains(stderr, "rank 0") || !strings.Contains(stderr, "still has") {
					t.Errorf("no warning naming rank 0's leftover:\n%s", stderr)
				}
			}
			if pid, outlived := testbin.Outlived(t, filepath.Join(dir, "bg"), time.Now().Add(5*time.Second)); outlived {
				t.Errorf("rank 0's background job in a group of its own (pid %d) outlived the job by 5 s", pid)
			}

		})
	}
}
