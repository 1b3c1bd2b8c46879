package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestFailingWorkerExitsOne: whatever way a worker fails (an exit code of
// its own, a signal, the only worker or one of several), slimerun exits 1,
// as torchrun does, and says the job failed; a job whose workers all exit
// 0 exits 0.
func TestFailingWorkerExitsOne(t *testing.T) {
	cases := []struct {
		name   string
		nproc  string
		script string
		want   int
	}{
		{"exit 7 of one", "1", `exit 7`, 1},
		{"exit 2 of three", "3", `if [ $RANK = 1 ]; then exit 2; fi; sleep 30`, 1},
		{"killed", "2", `if [ $RANK = 0 ]; then kill -9 $$; fi; sleep 30`, 1},
		{"exit 128+15 of two", "2", `if [ $RANK = 1 ]; then exit 143; fi; sleep 30`, 1},
		{"all succeed", "3", `exit 0`, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := exec.Command(slimerun, "--standalone", "--nproc-per-node", c.nproc, "--stop-grace", "1s", "sh", "-c", c.script).CombinedOutput()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != c.want {
				t.Fatalf("slimerun exited %d, want %d\n%s", code, c.want, out)
			}
			if c.want != 0 && !strings.Contains(string(out), "slimerun: job failed") {
				t.Errorf("no 'job failed' line:\n%s", out)
			}
		})
	}
}
