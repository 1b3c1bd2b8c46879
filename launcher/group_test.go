package launcher

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// alive says whether pid names a process that has not exited: a zombie
// (exited, not yet reaped by whoever inherited it) counts as gone.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}

// TestWorkersChildrenStopped: workers that have children of their own (a
// shell with a background sleep) are stopped as process groups when a
// worker fails, on SIGTERM (the shells die of it) and, when a worker
// ignores SIGTERM, on the SIGKILL after StopGrace: no grandchild outlives
// the job. A launcher that signalled only each worker's pid would leave
// every background sleep behind.
func TestWorkersChildrenStopped(t *testing.T) {
	cases := []struct {
		name, trap string
	}{
		{"term", ""},
		{"kill", "trap '' TERM; "},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			// Every rank starts a child; rank 1 then fails once the
			// others' children have started, leaving its own behind in
			// its process group.
			script := c.trap + `echo $$ > ` + dir + `/pid.$RANK; ` +
				`sleep 600 & echo $! > ` + dir + `/grand.$RANK.tmp; mv ` + dir + `/grand.$RANK.tmp ` + dir + `/grand.$RANK; ` +
				`if [ $RANK = 1 ]; then while [ ! -e ` + dir + `/grand.0 ] || [ ! -e ` + dir + `/grand.2 ]; do sleep 0.01; done; exit 3; fi; ` +
				`while :; do wait; done`
			_, stderr, err := run(t, Config{NProcPerNode: 3, StopGrace: 500 * time.Millisecond}, script)
			var we *WorkerError
			if !errors.As(err, &we) || we.Rank != 1 || we.ExitCode != 3 {
				t.Fatalf("err = %v; want rank 1 exit 3\n%s", err, stderr)
			}
			deadline := time.Now().Add(5 * time.Second)
			for r := range 3 {
				for _, who := range []string{"pid", "grand"} {
					b, err := os.ReadFile(filepath.Join(dir, who+"."+strconv.Itoa(r)))
					if err != nil {
						t.Fatal(err)
					}
					pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
					if err != nil {
						t.Fatal(err)
					}
					for alive(pid) && time.Now().Before(deadline) {
						time.Sleep(10 * time.Millisecond)
					}
					if alive(pid) {
						syscall.Kill(pid, syscall.SIGKILL)
						t.Errorf("rank %d's %s (pid %d) outlived the job by 5 s", r, map[string]string{"pid": "worker", "grand": "child"}[who], pid)
					}
				}
			}
		})
	}
}
