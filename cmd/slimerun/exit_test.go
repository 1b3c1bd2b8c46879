package main

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
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

// TestConsoleGoneAway: a console reader that goes away (slimerun ... |
// head) does not kill slimerun with SIGPIPE, leaving its workers to the
// guard with no report: the workers' output is dropped from then on, and
// the job ends with their status.
func TestConsoleGoneAway(t *testing.T) {
	cmd := exec.Command(slimerun, "--standalone", "--nproc-per-node", "2", "sh", "-c",
		`i=0; while [ $i -lt 60 ]; do echo "line $i"; i=$((i+1)); sleep 0.01; done; exit 0`)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 16)
	if _, err := io.ReadFull(out, b); err != nil { // the first lines, then the reader goes
		t.Fatal(err)
	}
	out.Close()
	err = cmd.Wait()
	if ee, ok := err.(*exec.ExitError); ok {
		t.Fatalf("slimerun with its console gone: %v (exit %d), want the workers' status 0", err, ee.ExitCode())
	} else if err != nil {
		t.Fatal(err)
	}
}

// TestLogWriteFails: a worker's log that cannot be written (here the disk
// is full: the log is /dev/full) does not kill the worker with SIGPIPE
// when its output copy stops: the log's failure is reported once, the
// console (--tee) still gets the output, and the job ends with the
// workers' status.
func TestLogWriteFails(t *testing.T) {
	dir := t.TempDir()
	logs := filepath.Join(dir, "L", "r1", "attempt_0", "0")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/full", filepath.Join(logs, "stdout.log")); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(slimerun, "--standalone", "--rdzv-id", "r1", "--log-dir", filepath.Join(dir, "L"), "--tee", "1",
		"sh", "-c", `for i in 1 2 3 4 5 6 7 8; do echo "line $i"; sleep 0.05; done`).CombinedOutput()
	if err != nil {
		t.Fatalf("slimerun with a log it cannot write: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "[0]: line 8") {
		t.Errorf("the console lost the worker's output:\n%s", out)
	}
	if !strings.Contains(string(out), "no space left on device") {
		t.Errorf("the log's failure is not reported:\n%s", out)
	}
}

// reapJob runs slimerun with nproc workers that each leave a process in
// a session of its own holding their output open (setsid sleep &), then
// exit 0: each worker's reap waits out its output's WaitDelay. It returns
// the command started and the directory where each worker notes that it
// is done (RANK.done) and its sleeper's pid (RANK.pid), which the test's
// end kills.
func reapJob(t *testing.T, nproc int) (*exec.Cmd, string) {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command(slimerun, "--standalone", "--nproc-per-node", strconv.Itoa(nproc), "sh", "-c",
		`setsid sleep 30 & echo $! > "$D/$RANK.pid"; touch "$D/$RANK.done"; exit 0`)
	cmd.Env = append(os.Environ(), "D="+dir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for r := range nproc {
			if b, err := os.ReadFile(filepath.Join(dir, strconv.Itoa(r)+".pid")); err == nil {
				if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
	})
	return cmd, dir
}

// TestReapTogether: the workers are reaped together, not one after
// another: eight whose output a leftover holds open take one WaitDelay
// (2 s) to reap, not eight (16 s).
func TestReapTogether(t *testing.T) {
	cmd, _ := reapJob(t, 8)
	start := time.Now()
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("slimerun took %v to reap 8 workers", took.Round(time.Millisecond))
	}
}

// TestSignalWhileReaping: a SIGINT that comes once the workers have
// exited, while slimerun reaps them, is the job's end as any other: exit
// 130, not 0 as if nothing had come.
func TestSignalWhileReaping(t *testing.T) {
	cmd, dir := reapJob(t, 2)
	for r := range 2 {
		p := filepath.Join(dir, strconv.Itoa(r)+".done")
		for end := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if _, err := os.Stat(p); err == nil {
				break
			}
			if time.Now().After(end) {
				t.Fatal("the workers did not start")
			}
		}
	}
	time.Sleep(200 * time.Millisecond) // exited: slimerun waits out their output's WaitDelay
	cmd.Process.Signal(syscall.SIGINT)
	err := cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 130 {
		t.Fatalf("slimerun interrupted while it reaped: %v, want exit 130", err)
	}
}
