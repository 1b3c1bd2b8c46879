// Package testbin builds the project's commands once per test binary, so
// that tests can launch real processes through slimerun.
package testbin

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/machine"
)

var (
	once sync.Once
	dir  string
	err  error
)

// Build compiles cmd/slimerun, cmd/slimebench, internal/cmd/agcheck and
// examples/allgather into a temporary directory and returns it. Call
// Cleanup from TestMain after the tests.
func Build() (string, error) {
	once.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(file), "..", "..")
		dir, err = os.MkdirTemp("", "slimego-bin-")
		if err != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", dir+"/",
			"./cmd/slimerun", "./cmd/slimebench", "./internal/cmd/agcheck", "./examples/allgather", "./examples/allgather_gemm")
		cmd.Dir = root
		if out, e := cmd.CombinedOutput(); e != nil {
			err = fmt.Errorf("go build: %v\n%s", e, out)
		}
	})
	return dir, err
}

// Cleanup removes what Build made.
func Cleanup() {
	if dir != "" {
		os.RemoveAll(dir)
	}
}

// FreePort returns a TCP port that was free on 127.0.0.1 a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Run runs argv with env added to this process's environment, and returns
// its output (stdout and stderr together) and exit code; a run that takes
// more than limit is killed and fails the test as hung.
func Run(t testing.TB, limit time.Duration, env []string, argv ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second // a child that keeps the output open does not hold Wait
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if ee, ok := err.(*exec.ExitError); ok {
			return out.String(), ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), 0
	case <-time.After(limit):
		cmd.Process.Kill()
		<-done
		t.Fatalf("%v hung:\n%s", argv, out.String())
	}
	return "", -1
}

// Outlived reads the pid a test's process wrote to pidFile and waits
// until that process is gone or until passes. If it is still alive then,
// Outlived kills it (the test leaves nothing behind) and reports true.
// A zombie (exited, not yet reaped by whoever inherited it) counts as
// gone (machine.Alive).
func Outlived(t testing.TB, pidFile string, until time.Time) (pid int, outlived bool) {
	t.Helper()
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	for machine.Alive(pid) && time.Now().Before(until) {
		time.Sleep(10 * time.Millisecond)
	}
	if !machine.Alive(pid) {
		return pid, false
	}
	syscall.Kill(pid, syscall.SIGKILL)
	return pid, true
}

// Serve listens on a loopback port and runs handle in a goroutine of its
// own for every connection it accepts (nil: hold the connection, saying
// nothing), until the test ends; then it closes the listener and every
// connection. It returns the listener's address: a peer or store that
// accepts and then stalls, for the tests of what waits on one.
func Serve(t testing.TB, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	closed := false
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		closed = true
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			if closed { // accepted as the test ended
				mu.Unlock()
				c.Close()
				return
			}
			conns = append(conns, c)
			mu.Unlock()
			if handle != nil {
				go handle(c)
			}
		}
	}()
	return ln.Addr().String()
}
