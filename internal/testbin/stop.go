package testbin

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// RankPid is the pid of a process running the program exe with RANK=rank
// in its environment (a worker slimerun started), or 0.
func RankPid(exe string, rank int) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if path, _ := os.Readlink("/proc/" + e.Name() + "/exe"); path != exe {
			continue
		}
		env, _ := os.ReadFile("/proc/" + e.Name() + "/environ")
		for _, kv := range bytes.Split(env, []byte{0}) {
			if string(kv) == "RANK="+strconv.Itoa(rank) {
				return pid
			}
		}
	}
	return 0
}

// Stopped is a job in which one rank stops (SIGSTOP: alive, but silent)
// and another must say why it fails within the job's timeout and a little.
type Stopped struct {
	Cmd      *exec.Cmd     // the job (slimerun ...), not started
	Exe      string        // the workers' program, to find the rank to stop
	Rank     int           // the rank stopped
	After    time.Duration // how long after it starts (into the timed work)
	Timeout  time.Duration // the job's timeout
	Prefix   string        // the start of the line that says why the other rank fails
	Names    []string      // that line holds one of these (it names the stopped rank)
	Patience time.Duration // how long to wait for the rank to start, and for that line
}

// Run runs the job, stops the rank, and fails t unless a line starting
// with Prefix, naming the stopped rank, comes within Timeout and 2.5 s.
// The job's processes are killed when it returns.
func (s Stopped) Run(t *testing.T) {
	t.Helper()
	out, err := s.Cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s.Cmd.Stderr = s.Cmd.Stdout
	if err := s.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pid int
	defer func() {
		if pid > 0 {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		s.Cmd.Process.Kill()
		s.Cmd.Wait()
	}()
	type line struct {
		at   time.Time
		text string
	}
	lines := make(chan line, 1024)
	go func(r io.Reader) {
		defer close(lines)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lines <- line{time.Now(), sc.Text()}
		}
	}(out)
	for deadline := time.Now().Add(s.Patience); pid == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no rank %d of %s within %v", s.Rank, s.Exe, s.Patience)
		}
		pid = RankPid(s.Exe, s.Rank)
	}
	time.Sleep(s.After)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	var all []string
	limit := time.After(s.Patience + s.Timeout)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the job ended with no line %q:\n%s", s.Prefix, strings.Join(all, "\n"))
			}
			all = append(all, l.text)
			if !strings.HasPrefix(l.text, s.Prefix) {
				continue
			}
			took := l.at.Sub(stopped)
			named := false
			for _, n := range s.Names {
				named = named || strings.Contains(l.text, n)
			}
			if !named {
				t.Fatalf("the error names no rank %d:\n%s", s.Rank, strings.Join(all, "\n"))
			}
			if took > s.Timeout+2500*time.Millisecond {
				t.Fatalf("%q came %v after rank %d stopped, want within the timeout %v and 2.5 s:\n%s", s.Prefix, took.Round(time.Millisecond), s.Rank, s.Timeout, strings.Join(all, "\n"))
			}
			t.Logf("after %v: %s", took.Round(time.Millisecond), l.text)
			return
		case <-limit:
			t.Fatalf("no line %q within %v of rank %d's stop:\n%s", s.Prefix, s.Patience+s.Timeout, s.Rank, strings.Join(all, "\n"))
		}
	}
}
