package machine

import "testing"

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
