package machine

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestAliveOutOfDescriptors: a running process is alive even where its
// /proc entry cannot be read for a cause of the reader's (out of
// descriptors here; a /proc that hides other users' processes alike). It
// read as exited, so that p2p's Publish could take over a live endpoint's
// name; only /proc's word that the process is gone says so now.
func TestAliveOutOfDescriptors(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	pid := cmd.Process.Pid
	if !Alive(pid) {
		t.Fatalf("Alive(%d) = false for a running process", pid)
	}
	// The lowest free descriptor becomes the limit: no file opens.
	f, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	n := f.Fd()
	f.Close()
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	lim := syscall.Rlimit{Cur: uint64(n), Max: old.Max}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	got := Alive(pid)
	syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old)
	if !got {
		t.Errorf("Alive(%d) = false out of descriptors: a running process read as exited", pid)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if Alive(pid) {
		t.Errorf("Alive(%d) = true once it has exited and been reaped", pid)
	}
}

// TestSamePIDSpace: an unreadable machine ("") matches nothing, not even
// itself: the namespace's link alone is the same on every machine.
func TestSamePIDSpace(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{{"", "", false}, {"x/pid:[1]", "x/pid:[1]", true}, {"x/pid:[1]", "y/pid:[1]", false}, {"", "x/pid:[1]", false}} {
		if got := SamePIDSpace(tc.a, tc.b); got != tc.want {
			t.Errorf("SamePIDSpace(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
	if p := PIDSpace(); p != "" && !SamePIDSpace(p, PIDSpace()) {
		t.Errorf("PIDSpace %q does not match itself", p)
	}
}

// TestAliveHiddenProcess: under a /proc mounted hidepid=invisible, another
// user's process has no entry, though kill finds it (EPERM): it is alive.
// It read as exited (the entry missing). The check runs in a child, as
// uid 65534 in a mount namespace of its own.
func TestAliveHiddenProcess(t *testing.T) {
	if os.Getenv("ALIVE_CHILD_PID") != "" {
		t.Skip("the child of TestAliveHiddenProcess")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount /proc and run as another user")
	}
	for _, tool := range []string{"unshare", "setpriv"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s", tool)
		}
	}
	sleep := exec.Command("sleep", "30")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { sleep.Process.Kill(); sleep.Wait() }()
	// The test binary, where uid 65534 may run it.
	dir := t.TempDir()
	for d := dir; d != "/tmp" && d != "/"; d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	bin := filepath.Join(dir, "machine.test")
	b, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c",
		`mount -t proc -o hidepid=invisible proc /proc && exec setpriv --reuid=65534 --regid=65534 --clear-groups "$0" -test.run='^TestAliveChild$' -test.v`, bin)
	cmd.Env = append(os.Environ(), "ALIVE_CHILD_PID="+strconv.Itoa(sleep.Process.Pid))
	out, err := cmd.CombinedOutput()
	if strings.Contains(string(out), "mount:") || strings.Contains(string(out), "unshare:") {
		t.Skipf("no mount namespace here: %s", out)
	}
	if err != nil || !strings.Contains(string(out), "ALIVE true") {
		t.Fatalf("%v:\n%s\nwant ALIVE true (the hidden process runs)", err, out)
	}
}

// TestAliveChild is TestAliveHiddenProcess's child: it says what Alive
// says of the process it is given.
func TestAliveChild(t *testing.T) {
	v := os.Getenv("ALIVE_CHILD_PID")
	if v == "" {
		t.Skip("run by TestAliveHiddenProcess")
	}
	pid, _ := strconv.Atoi(v)
	_, statErr := os.Stat("/proc/" + v)
	fmt.Printf("ALIVE %v (kill: %v, /proc entry: %v)\n", Alive(pid), syscall.Kill(pid, 0), statErr)
}
