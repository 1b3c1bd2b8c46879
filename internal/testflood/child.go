package testflood

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A flood's victim runs in a process of its own, whose descriptors a test
// limits (a host's `ulimit -n`) without limiting the test's: the test
// binary again, running one test of it (the child), which talks to the
// parent test in lines on its standard output: "NAME value" to hand it a
// value (an address), "LOG text" and "FAIL text" to report, "DONE" when
// it has said all.

// childLimit bounds a child's life (its test serves at most two minutes).
const childLimit = 3 * time.Minute

// childEnv marks a child: its value names the test it runs.
const childEnv = "SLIME_TESTFLOOD_CHILD"

// IsChild reports whether this process is the child that Child started to
// run the test named name. A child test skips itself otherwise, and the
// parent test skips itself in the child.
func IsChild(name string) bool { return os.Getenv(childEnv) == name }

// Child runs the test named name of this test binary in a child process,
// and returns its standard output, to read line by line (Value, Report);
// the child is killed, and waited for, when t ends, or after childLimit.
func Child(t testing.TB, name string) *bufio.Reader {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$")
	cmd.Env = append(os.Environ(), childEnv+"="+name)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// A child that hangs before it says a word must not hold the test
	// until the binary's timeout: killed, its output ends, and Value or
	// Report fails.
	stop := time.AfterFunc(childLimit, func() { cmd.Process.Kill() })
	t.Cleanup(func() { stop.Stop(); cmd.Process.Kill(); cmd.Wait() })
	return bufio.NewReader(out)
}

// Value reads the child's lines until one names name, and returns its
// value; the child ending first, or failing (a "FAIL" line), fails t.
func Value(t testing.TB, r *bufio.Reader, name string) string {
	t.Helper()
	for {
		line, err := r.ReadString('\n')
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
		if v, ok := strings.CutPrefix(line, "FAIL "); ok {
			t.Fatalf("the child: %s", v)
		}
		if err != nil {
			t.Fatalf("the child gave no %s: %v", name, err)
		}
	}
}

// Report reads the child's lines until its "DONE" or the end of its
// output: a "FAIL" line fails t, a "LOG" line is logged.
func Report(t testing.TB, r *bufio.Reader) {
	t.Helper()
	for {
		line, err := r.ReadString('\n')
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, "FAIL "); ok {
			t.Error(v)
		} else if v, ok := strings.CutPrefix(line, "LOG "); ok {
			t.Log(v)
		}
		if err != nil || line == "DONE" {
			return
		}
	}
}

// Say writes one line to the parent (a child's standard output).
func Say(format string, a ...any) { fmt.Fprintf(os.Stdout, format+"\n", a...) }

// LimitDescriptors limits this process (a child) to n descriptors.
func LimitDescriptors(n uint64) error {
	return syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: n, Max: n})
}

// ListenFailures opens and closes a listener every 10 ms for d, and
// counts those the process could not open (out of descriptors): a
// process whose listener a flood holds must still open the sockets it
// needs.
func ListenFailures(d time.Duration) (fails, tries int, last error) {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		tries++
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fails, last = fails+1, err
			continue
		}
		l.Close()
	}
	return fails, tries, last
}
