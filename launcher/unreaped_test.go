package launcher

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestUnreapedAfterKill: a worker whose exit the kernel does not report
// after SIGKILL (one in uninterruptible sleep, stuck on a hung NFS mount or
// in a device driver, ends only when it leaves the kernel) does not hang
// the launcher: Run returns, soon after the SIGKILL, an error that names
// its rank and pid and says that it could not be reaped. The kernel's wait
// is simulated: waitWorker, for rank 1, returns only when the test ends.
func TestUnreapedAfterKill(t *testing.T) {
	dir := t.TempDir()
	release := make(chan struct{})
	real := waitWorker
	waitWorker = func(pid int) (syscall.WaitStatus, error) {
		st, err := real(pid)
		if b, _ := os.ReadFile(filepath.Join(dir, "pid.1")); strings.TrimSpace(string(b)) == strconv.Itoa(pid) {
			<-release // rank 1: as if still in the kernel
		}
		return st, err
	}
	t.Cleanup(func() { close(release); waitWorker = real })
	bound := reapBound
	reapBound = time.Second
	t.Cleanup(func() { reapBound = bound })
	const grace = 300 * time.Millisecond
	type result struct {
		err  error
		took time.Duration
	}
	done := make(chan result, 1)
	go func() {
		start := time.Now()
		// Rank 0 fails; rank 1 ignores SIGTERM, so it gets the grace's
		// SIGKILL, whose exit waitWorker then never reports.
		_, _, err := run(t, Config{NProcPerNode: 2, StopGrace: grace},
			`echo $$ > `+dir+`/pid.$RANK.tmp && mv `+dir+`/pid.$RANK.tmp `+dir+`/pid.$RANK; if [ $RANK = 0 ]; then sleep 0.3; exit 3; fi; trap '' TERM; while :; do sleep 0.05; done`)
		done <- result{err, time.Since(start)}
	}()
	limit := 2*time.Second + grace + reapBound + 5*time.Second
	var r result
	select {
	case r = <-done:
	case <-time.After(limit):
		t.Fatalf("Run has not returned %v after its start: it waits without end for a killed worker that cannot be reaped", limit)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "pid.1"))
	pid := strings.TrimSpace(string(b))
	var ue *UnreapedError
	if !errors.As(r.err, &ue) {
		t.Fatalf("err = %v (%T); want an *UnreapedError", r.err, r.err)
	}
	if len(ue.Workers) != 1 || ue.Workers[0].Rank != 1 || strconv.Itoa(ue.Workers[0].Pid) != pid {
		t.Errorf("unreaped workers %+v; want rank 1, pid %s", ue.Workers, pid)
	}
	msg := r.err.Error()
	for _, want := range []string{"rank 1 (pid " + pid, "could not be reaped", "SIGKILL"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
		}
	}
	// The cause of the stop is still there: rank 0's failure.
	var we *WorkerError
	if !errors.As(r.err, &we) || we.Rank != 0 || we.ExitCode != 3 {
		t.Errorf("err = %v; want it to carry rank 0's exit 3", r.err)
	}
	// Within the bound after the SIGKILL (start, rank 0's failure, the
	// grace, the bound; slack for a loaded machine).
	if most := 300*time.Millisecond + grace + reapBound + 3*time.Second; r.took > most {
		t.Errorf("Run returned after %v; want under %v", r.took, most)
	}
	t.Logf("Run returned after %v: %v", r.took, r.err)
}

// blockingWriter takes nothing: each Write waits until release is closed,
// as a console whose reader has stopped reading, or a log file on a hung
// mount, would.
type blockingWriter struct{ release chan struct{} }

func (b *blockingWriter) Write(p []byte) (int, error) {
	<-b.release
	return len(p), nil
}

// TestReapBoundedByStuckOutput: a worker's output that cannot be written
// does not hold the reap without end: Run returns WaitDelay and reapBound
// after the worker exited, warning that rank 0's output is left to finish.
func TestReapBoundedByStuckOutput(t *testing.T) {
	bound := reapBound
	reapBound = time.Second
	t.Cleanup(func() { reapBound = bound })
	stuck := &blockingWriter{release: make(chan struct{})}
	t.Cleanup(func() { close(stuck.release) })
	var warns logLines
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		done <- Run(context.Background(), Config{Standalone: true, NProcPerNode: 1, StopGrace: time.Second,
			Program: "sh", Args: []string{"-c", "echo hello"}, Stdout: stuck, Stderr: io.Discard, Warnf: warns.logf})
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Run has not returned 20s after its start: the reap waits without end for output that cannot be written")
	}
	if err != nil {
		t.Errorf("err = %v; want nil (the worker exited 0)", err)
	}
	if w := warns.String(); !strings.Contains(w, "rank 0 (pid ") || !strings.Contains(w, "still being written") {
		t.Errorf("no warning of rank 0's stuck output:\n%s", w)
	}
	t.Logf("Run returned after %v", time.Since(start))
}
