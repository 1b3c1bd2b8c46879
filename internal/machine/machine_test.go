package machine

import (
	"os"
	"os/exec"
	"testing"
	"time"
	"unsafe"
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

// TestAllocHuge maps memory for huge pages, writes every byte of it, and
// checks that it starts on a huge page boundary, reads back, and (where
// the kernel gives huge pages to memory advised so) is backed by them.
func TestAllocHuge(t *testing.T) {
	const size = 3*HugePageSize - 12345 // the last huge page part used
	b, free, err := AllocHuge(size)
	if err != nil {
		t.Fatal(err)
	}
	defer free()
	if len(b) != size || uintptr(unsafe.Pointer(&b[0]))%HugePageSize != 0 {
		t.Fatalf("%d bytes at %p, want %d on a %d boundary", len(b), &b[0], size, HugePageSize)
	}
	for i := range b {
		b[i] = byte(i * 7)
	}
	for i := range b {
		if b[i] != byte(i*7) {
			t.Fatalf("byte %d reads %d", i, b[i])
		}
	}
	got := HugeBytes(b)
	t.Logf("transparent huge pages %q: %d of %d bytes in huge pages", THP(), got, size)
	if got < 0 {
		t.Fatal("HugeBytes could not read /proc/self/smaps")
	}
	if mode := THP(); (mode == "always" || mode == "madvise") && got < 3*HugePageSize {
		// The kernel may have no whole huge page to give; say so, as
		// the benchmark's title does, rather than fail on a full machine.
		t.Logf("no huge page given (mode %s): the machine may have no free huge page", mode)
	}
	if _, _, err := AllocHuge(0); err == nil {
		t.Fatal("AllocHuge(0) succeeded")
	}
	if HugeBytes(make([]byte, 1<<20)) < 0 {
		t.Fatal("HugeBytes of heap memory: -1")
	}
}
