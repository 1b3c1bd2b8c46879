package main

import (
	"bufio"
	"bytes"
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

// TestP2PPeerStopped: rank 1 of slimebench p2p is stopped (SIGSTOP: a
// slow peer, alive but silent) during the timed rounds, with
// SLIME_TIMEOUT=3s. Rank 0 must say why it fails, naming rank 1, within
// the timeout and a little: not first wait for its endpoint's Close, which
// waits up to heartbeats (5 s each) for a silent peer's leases.
func TestP2PPeerStopped(t *testing.T) {
	dir, err := testbin.Build()
	if err != nil {
		t.Fatal(err)
	}
	const timeout = 3 * time.Second
	cmd := exec.Command(filepath.Join(dir, "slimerun"), "--standalone", "--nproc-per-node", "2", "--stop-grace", "1",
		filepath.Join(dir, "slimebench"), "p2p", "--op", "read", "--batch", "1", "--concurrency", "1", "--register", "0",
		"--no-baselines", "--min-time", "60s")
	cmd.Env = append(os.Environ(), "SLIME_TIMEOUT="+timeout.String())
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
	for deadline := time.Now().Add(30 * time.Second); pid == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no slimebench rank 1 within 30 s")
		}
		pid = benchRankPid(dir, 1)
	}
	time.Sleep(2 * time.Second) // into the timed rounds
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	var all []string
	limit := time.After(40 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("slimerun ended with no error from rank 0:\n%s", strings.Join(all, "\n"))
			}
			all = append(all, l.text)
			if !strings.HasPrefix(l.text, "[0]: slimebench: ") {
				continue
			}
			took := l.at.Sub(stopped)
			if !strings.Contains(l.text, "rank1") && !strings.Contains(l.text, "rank 1") {
				t.Fatalf("rank 0's error names no rank 1:\n%s", strings.Join(all, "\n"))
			}
			if took > timeout+2500*time.Millisecond {
				t.Fatalf("rank 0 said why it failed %v after rank 1 stopped, want within SLIME_TIMEOUT %v and 2.5 s:\n%s", took.Round(time.Millisecond), timeout, strings.Join(all, "\n"))
			}
			t.Logf("after %v: %s", took.Round(time.Millisecond), l.text)
			return
		case <-limit:
			t.Fatalf("no error from rank 0 within 40 s of rank 1's stop:\n%s", strings.Join(all, "\n"))
		}
	}
}

// benchRankPid is the pid of the process running dir's slimebench with
// RANK=rank in its environment, or 0.
func benchRankPid(dir string, rank int) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if exe, _ := os.Readlink("/proc/" + e.Name() + "/exe"); exe != filepath.Join(dir, "slimebench") {
			continue
		}
		env, _ := os.ReadFile("/proc/" + e.Name() + "/environ")
		for _, kv := range bytes.Split(env, []byte{0}) {
			if string(kv) == "RANK="+strconv.Itoa(rank) {
				pid, _ := strconv.Atoi(e.Name())
				return pid
			}
		}
	}
	return 0
}
