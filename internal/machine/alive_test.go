package machine

import (
	"os"
	"os/exec"
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
