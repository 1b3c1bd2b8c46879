package machine

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
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

// FuzzCountCPUList: the CPU list parser (of /sys/devices/system/cpu/online)
// never panics, counts nothing negative, and counts no more than the list
// names: each range at most 2^20 + 1 processors.
func FuzzCountCPUList(f *testing.F) {
	for _, s := range []string{"0", "0-3,8,10-11", "", "3-1", "0-99999999", "9223372036854775807", "+1-+2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n := CountCPUList(s)
		if n < 0 || n > (strings.Count(s, ",")+1)*(1<<20+1) {
			t.Fatalf("CountCPUList(%q) = %d", s, n)
		}
	})
}

// FuzzStatFields: the /proc/PID/stat splitter never panics, and finds
// fields only after a ')', none of them holding a space.
func FuzzStatFields(f *testing.F) {
	f.Add([]byte("1 (a b) S 0 1 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 42 0 0\n"))
	f.Add([]byte("1 (a) b)) R 0"))
	f.Add([]byte("no command"))
	f.Fuzz(func(t *testing.T, b []byte) {
		fs, ok := StatFields(b)
		if ok != bytes.ContainsRune(b, ')') {
			t.Fatalf("ok %v for %q", ok, b)
		}
		for _, s := range fs {
			if s == "" || strings.ContainsAny(s, " \t\n") {
				t.Fatalf("field %q of %q", s, b)
			}
		}
	})
}

// FuzzVMARange: the head line parser of /proc/self/smaps never panics,
// and what it accepts is a range that is not empty.
func FuzzVMARange(f *testing.F) {
	f.Add("7f0000000000-7f0000001000 rw-p 00000000 00:00 0")
	f.Add("1-0 r")
	f.Add("AnonHugePages:         0 kB")
	f.Fuzz(func(t *testing.T, line string) {
		if s, e, ok := vmaRange(line); ok && s >= e {
			t.Fatalf("vmaRange(%q) = %#x, %#x", line, s, e)
		}
	})
}

// TestShare: a rank's share of the memory available is the whole for one
// rank and a quarter for four (within what /proc/meminfo moved between
// the two reads), and names its bound.
func TestShare(t *testing.T) {
	one, what1 := Share(1)
	four, what4 := Share(4)
	if _, _, ok := Memory(); !ok {
		t.Skip("no /proc/meminfo")
	}
	if one <= 0 || four <= 0 || four > one/4+one/64 || four < one/4-one/64 {
		t.Errorf("Share(1) = %d, Share(4) = %d: not a quarter", one, four)
	}
	if what1 != "memory available" || !strings.Contains(what4, "each of 4 ranks") {
		t.Errorf("Share's bounds: %q, %q", what1, what4)
	}
}
