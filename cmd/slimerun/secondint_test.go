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

// TestSecondInterruptKills: workers that take their time on SIGINT (a
// handler that saves a checkpoint) get the whole --stop-grace after a
// first ^C; a second ^C ends the wait at once with SIGKILL, as a user who
// presses it again means, and slimerun exits 130 leaving no worker.
func TestSecondInterruptKills(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(slimerun, "--standalone", "--nproc-per-node", "2", "--stop-grace", "30s",
		"sh", "-c", `trap 'echo got INT' INT; echo $$ > `+dir+`/pid.$RANK; while :; do sleep 0.05; done`)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	var pids []int
	for deadline := time.Now().Add(10 * time.Second); len(pids) < 2; time.Sleep(10 * time.Millisecond) {
		pids = pids[:0]
		for r := range 2 {
			if b, err := os.ReadFile(filepath.Join(dir, "pid."+strconv.Itoa(r))); err == nil {
				if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
					pids = append(pids, pid)
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("workers did not start:\n%s", out.String())
		}
	}
	time.Sleep(100 * time.Millisecond) // the traps are set
	cmd.Process.Signal(syscall.SIGINT)
	time.Sleep(500 * time.Millisecond) // the grace runs: the workers handle it and go on
	start := time.Now()
	cmd.Process.Signal(syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 130 {
			t.Errorf("slimerun: %v, want exit 130\n%s", err, out.String())
		}
		t.Logf("ended %v after the second SIGINT", time.Since(start).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Fatalf("slimerun still runs 10 s after a second SIGINT (grace 30 s):\n%s", out.String())
	}
	waitGone(t, pids)
}
