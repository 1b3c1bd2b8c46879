package main

import (
	"bufio"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestKVCachePrefillStopped: prefill rank 0 is stopped (SIGSTOP: a slow
// peer, alive but silent) in the middle of the rounds, with --timeout 3s.
// The decode rank must say why it fails, naming the lost rank, within
// the timeout and a little: not first wait for its endpoint's Close, which
// waits up to heartbeats (5 s each) for a silent peer to give back its
// leases of the cache.
func TestKVCachePrefillStopped(t *testing.T) {
	dir := build(t)
	const timeout = 3 * time.Second
	cmd := exec.Command(filepath.Join(dir, "slimerun"), "--standalone", "--nproc-per-node", "2", "--stop-grace", "1",
		filepath.Join(dir, "kvcache"), "--pages", "256", "--batch", "16", "--rounds", "1000000", "--timeout", timeout.String())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pid int
	defer func() {
		if pid > 0 {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		cmd.Process.Kill()
		cmd.Wait()
	}()
	type line struct {
		at   time.Time
		text string
	}
	lines := make(chan line, 1024)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- line{time.Now(), sc.Text()}
		}
	}()
	for deadline := time.Now().Add(20 * time.Second); pid == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no kvcache rank 0 within 20 s")
		}
		pid = rankPid(dir, 0)
	}
	time.Sleep(time.Second)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	var all []string
	limit := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("slimerun ended with no error from decode rank 1:\n%s", strings.Join(all, "\n"))
			}
			all = append(all, l.text)
			if !strings.HasPrefix(l.text, "[1]: kvcache: rank 1: ") {
				continue
			}
			took := l.at.Sub(stopped)
			if !strings.Contains(l.text, "rank0") && !strings.Contains(l.text, "[0]") && !strings.Contains(l.text, "rank 0") {
				t.Fatalf("decode rank 1's error names no rank 0:\n%s", strings.Join(all, "\n"))
			}
			if took > timeout+2500*time.Millisecond {
				t.Fatalf("decode rank 1 said why it failed %v after rank 0 stopped, want within --timeout %v and 2.5 s:\n%s", took.Round(time.Millisecond), timeout, strings.Join(all, "\n"))
			}
			t.Logf("after %v: %s", took.Round(time.Millisecond), l.text)
			return
		case <-limit:
			t.Fatalf("no error from decode rank 1 within 30 s of rank 0's stop:\n%s", strings.Join(all, "\n"))
		}
	}
}
