package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestEscapedProcessHoldsOutput: a worker starts a process that leaves its
// session (setsid) but keeps the worker's standard output, then exits 0.
// slimerun must not wait for it, and must say in words what happened
// (which rank, that a process it left holds its output, what to do), not
// Go's "exec: WaitDelay expired before I/O complete".
func TestEscapedProcessHoldsOutput(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(slimerun, "--standalone", "--nproc-per-node", "2", "sh", "-c",
		`setsid sh -c 'echo $$ > `+dir+`/esc.'$RANK'; exec sleep 30' & sleep 0.2; echo ok`)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	defer func() { // the escaped processes are this test's to end
		for r := range 2 {
			b, _ := os.ReadFile(filepath.Join(dir, "esc."+strconv.Itoa(r)))
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}()
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("slimerun: %v, want exit 0:\n%s", err, out.String())
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("slimerun waited for the escaped process:\n%s", out.String())
	}
	s := out.String()
	if strings.Contains(s, "WaitDelay") {
		t.Fatalf("Go's words, not slimerun's (after %v):\n%s", time.Since(start).Round(time.Millisecond), s)
	}
	for r := range 2 {
		if !strings.Contains(s, "rank "+strconv.Itoa(r)+" (pid ") || !strings.Contains(s, "still holds its standard output or error open") || !strings.Contains(s, "setsid") {
			t.Fatalf("no warning naming rank %d and the process it left holding its output:\n%s", r, s)
		}
	}
}
