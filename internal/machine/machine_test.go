package machine

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

func TestCountCPUList(t *testing.T) {
	for in, want := range map[string]int{
		"0": 1, "0-1": 2, "0-3,8,10-11": 7, "5": 1, "0-0": 1,
		"": 0, "x": 0, "3-1": 0, "0-": 0, "-1": 0, "0,,1": 0, "0-99999999": 0,
	} {
		if got := CountCPUList(in); got != want {
			t.Errorf("CountCPUList(%q) = %d, want %d", in, got, want)
		}
	}
}

func TestThisMachine(t *testing.T) {
	if n := OnlineCPUs(); n < 1 {
		t.Errorf("OnlineCPUs() = %d", n)
	}
	if id := BootID(); len(id) != 36 {
		t.Errorf("BootID() = %q, want a UUID", id)
	}
}

func TestMemory(t *testing.T) {
	avail, total, ok := Memory()
	if !ok || avail <= 0 || total < avail {
		t.Fatalf("Memory() = %d available of %d, %v", avail, total, ok)
	}
}

// TestAlive: this process runs; a child that exited and is not reaped (a
// zombie) does not, nor once reaped.
func TestAlive(t *testing.T) {
	if !Alive(os.Getpid()) {
		t.Error("this process is not alive")
	}
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	deadline := time.Now().Add(5 * time.Second)
	for Alive(pid) && time.Now().Before(deadline) { // exits, unreaped: a zombie
		time.Sleep(5 * time.Millisecond)
	}
	if Alive(pid) {
		t.Errorf("a child that exited (a zombie) is alive")
	}
	cmd.Wait()
	if Alive(pid) || Alive(0) || Alive(-1) {
		t.Errorf("a reaped child, or pid 0 or -1, is alive")
	}
}
