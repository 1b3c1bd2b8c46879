package launcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/testbin"
)

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
					if pid, outlived := testbin.Outlived(t, filepath.Join(dir, who+"."+strconv.Itoa(r)), deadline); outlived {
						t.Errorf("rank %d's %s (pid %d) outlived the job by 5 s", r, map[string]string{"pid": "worker", "grand": "child"}[who], pid)
					}
				}
			}
		})
	}
}

// TestGrandchildIgnoringTermKilled: a worker's child that ignores SIGTERM
// and SIGINT (trap ”) outlives its worker unless the launcher kills the
// workers' process groups after the workers themselves have exited: when
// a worker failed, when the job was interrupted, and when every worker
// exited 0 but left such a child behind (the job's processes end with the
// job; a warning names what was left). The children write nowhere, so
// that the workers' exits are seen at once; in the last case they hold
// the workers' stdout and stderr, as a shell script's background job
// does, and a worker that exited 0 is still a success.
func TestGrandchildIgnoringTermKilled(t *testing.T) {
	succeeded := func(t *testing.T, err error, stderr string) {
		if err != nil {
			t.Errorf("err = %v; want nil\n%s", err, stderr)
		}
		if !strings.Contains(stderr, "WARNING: rank 0's process group") || !strings.Contains(stderr, "WARNING: rank 1's process group") {
			t.Errorf("no warning names the processes left in each rank's group:\n%s", stderr)
		}
	}
	cases := []struct {
		name string
		// then runs in each worker once every rank's child has started.
		then      string
		interrupt bool
		holdOut   bool
		check     func(t *testing.T, err error, stderr string)
	}{
		{"failed", `[ $RANK = 1 ] && exit 7; exec sleep 30`, false, false, func(t *testing.T, err error, stderr string) {
			var we *WorkerError
			if !errors.As(err, &we) || we.Rank != 1 || we.ExitCode != 7 {
				t.Errorf("err = %v; want rank 1 exit 7\n%s", err, stderr)
			}
		}},
		{"interrupted", `exec sleep 30`, true, false, func(t *testing.T, err error, stderr string) {
			var ie *ErrInterrupted
			if !errors.As(err, &ie) {
				t.Errorf("err = %v; want *ErrInterrupted\n%s", err, stderr)
			}
		}},
		{"succeeded", `exit 0`, false, false, succeeded},
		{"succeeded holding stdout", `exit 0`, false, true, succeeded},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			out := ` >/dev/null 2>&1`
			if c.holdOut {
				out = ""
			}
			script := `(trap '' TERM INT; exec sleep 600)` + out + ` & echo $! > ` + dir + `/grand.$RANK.tmp; mv ` + dir + `/grand.$RANK.tmp ` + dir + `/grand.$RANK; ` +
				`while [ ! -e ` + dir + `/grand.0 ] || [ ! -e ` + dir + `/grand.1 ]; do sleep 0.01; done; ` + c.then
			var outb, errb syncBuffer
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if c.interrupt {
				go func() {
					for _, f := range []string{"grand.0", "grand.1"} {
						for {
							if _, err := os.Stat(filepath.Join(dir, f)); err == nil || ctx.Err() != nil {
								break
							}
							time.Sleep(10 * time.Millisecond)
						}
					}
					cancel()
				}()
			}
			err := Run(ctx, Config{Standalone: true, NProcPerNode: 2, StopGrace: 500 * time.Millisecond,
				Program: "sh", Args: []string{"-c", script}, Stdout: &outb, Stderr: &errb})
			c.check(t, err, errb.String())
			// Run has returned: the children must be dead now, give or
			// take the delivery of a SIGKILL already sent.
			deadline := time.Now().Add(3 * time.Second)
			for r := range 2 {
				if pid, outlived := testbin.Outlived(t, filepath.Join(dir, "grand."+strconv.Itoa(r)), deadline); outlived {
					t.Errorf("rank %d's child (pid %d), which ignores SIGTERM, outlived the job", r, pid)
				}
			}
		})
	}
}

// TestWaitExited: waitExited reads a child's exit from waitid's siginfo
// as the wait status cmd.Wait then reaps, for exits and deaths by signal,
// and leaves the child to be reaped.
func TestWaitExited(t *testing.T) {
	for _, script := range []string{"exit 0", "exit 7", "exit 255", "kill -9 $$", "kill -TERM $$", "kill -SEGV $$"} {
		cmd := exec.Command("sh", "-c", script)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		got, err := waitExited(cmd.Process.Pid)
		if err != nil {
			t.Fatalf("%s: %v", script, err)
		}
		if !zombie(cmd.Process.Pid) {
			t.Errorf("%s: the child was reaped", script)
		}
		cmd.Wait()
		if want := cmd.ProcessState.Sys().(syscall.WaitStatus); got != want {
			t.Errorf("%s: status %#x, want %#x", script, got, want)
		}
	}
}

// zombie says whether pid is a process that has exited, not yet reaped.
func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return err == nil && i >= 0 && i+2 < len(s) && s[i+2] == 'Z'
}

// TestLeftoverWithExitedMainThread: a process left in a worker's group
// whose main thread has exited while another thread runs (its /proc stat
// reads "Z") is still alive: after a success it is stopped with the
// others, not taken for a zombie and left.
func TestLeftoverWithExitedMainThread(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "mainexit.c")
	prog := filepath.Join(dir, "mainexit")
	os.WriteFile(src, []byte(`#include <pthread.h>
#include <signal.h>
#include <unistd.h>
static void *sleeper(void *a) { for (;;) pause(); return a; }
int main(void) {
	pthread_t t;
	signal(SIGTERM, SIG_IGN);
	pthread_create(&t, 0, sleeper, 0);
	pthread_exit(0);
}
`), 0o600)
	if out, err := exec.Command(cc, "-pthread", "-o", prog, src).CombinedOutput(); err != nil {
		t.Skipf("cc: %v\n%s", err, out)
	}
	// The worker exits 0 once its child's main thread has exited.
	script := prog + ` >/dev/null 2>&1 & echo $! > ` + dir + `/grand.$RANK; ` +
		`while ! grep -q '^State:.Z' /proc/$!/status 2>/dev/null; do sleep 0.01; done; exit 0`
	var outb, errb syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = Run(ctx, Config{Standalone: true, NProcPerNode: 1, StopGrace: 500 * time.Millisecond,
		Program: "sh", Args: []string{"-c", script}, Stdout: &outb, Stderr: &errb})
	if err != nil || !strings.Contains(errb.String(), "WARNING: rank 0's process group") {
		t.Errorf("err = %v, want nil and a warning naming what rank 0 left:\n%s", err, errb.String())
	}
	if pid, outlived := testbin.Outlived(t, filepath.Join(dir, "grand.0"), time.Now().Add(3*time.Second)); outlived {
		t.Errorf("rank 0's child (pid %d), its main thread exited, outlived the job", pid)
	}
}
