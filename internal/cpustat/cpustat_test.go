package cpustat

import (
	"os"
	"runtime"
	"testing"
	"time"
)

// TestParse: two snapshots of /proc/stat two seconds apart on a machine of
// two processors, 3 s of idle and iowait between them out of 4: a quarter
// busy.
func TestParse(t *testing.T) {
	t0 := time.Unix(1764480000, 0)
	var s [2]Sample
	for i, at := range []time.Time{t0, t0.Add(2 * time.Second)} {
		b, err := os.ReadFile([]string{"testdata/stat.0", "testdata/stat.1"}[i])
		if err != nil {
			t.Fatal(err)
		}
		var ok bool
		if s[i], ok = parse(b, at); !ok || s[i].cpus != 2 {
			t.Fatalf("snapshot %d: ok %v, %d processors", i, ok, s[i].cpus)
		}
	}
	if got := Busy(s[0], s[1]); got != 0.25 {
		t.Errorf("Busy = %v, want 0.25", got)
	}
	if got := Busy(s[0], s[0]); got != 0 {
		t.Errorf("Busy over no time = %v, want 0", got)
	}
	for name, in := range map[string]string{
		"empty":             "",
		"no aggregate line": "cpu0 1 2 3 4 5\nintr 1\n",
		"no processors":     "cpu  1 2 3 4 5 6\n",
		"short line":        "cpu  1 2 3\ncpu0 1 2 3\n",
		"not a number":      "cpu  1 2 3 x 5 6\ncpu0 1 2 3 4 5 6\n",
	} {
		if _, ok := parse([]byte(in), t0); ok {
			t.Errorf("%s: parsed", name)
		}
	}
}

// TestBusyLive: a second in which every processor spins reads as busy,
// whatever else the (shared) machine is doing.
func TestBusyLive(t *testing.T) {
	a, ok := Now()
	if !ok {
		t.Skip("this platform does not report idle time")
	}
	if a.cpus < runtime.NumCPU() {
		t.Errorf("%d processors in /proc/stat, %d usable", a.cpus, runtime.NumCPU())
	}
	if runtime.GOMAXPROCS(0) < a.cpus {
		t.Skipf("GOMAXPROCS %d cannot keep %d processors busy", runtime.GOMAXPROCS(0), a.cpus)
	}
	done := make(chan struct{})
	for range a.cpus {
		go func() {
			for end := time.Now().Add(time.Second); time.Now().Before(end); {
			}
			done <- struct{}{}
		}()
	}
	for range a.cpus {
		<-done
	}
	b, _ := Now()
	if busy := Busy(a, b); busy < 0.9 {
		t.Errorf("spinning on %d processors: %.2f busy", a.cpus, busy)
	}
}

// FuzzParse: the /proc/stat parser never panics; a text it accepts has a
// processor, and the share of busy time between any two of its samples
// is a number from 0 to 1.
func FuzzParse(f *testing.F) {
	for _, name := range []string{"testdata/stat.0", "testdata/stat.1"} {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("cpu  1 2 3 -9223372036854775808 9223372036854775807 6\ncpu0 1\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		t0 := time.Unix(1764480000, 0)
		s, ok := parse(b, t0)
		if !ok {
			return
		}
		if s.cpus <= 0 {
			t.Fatalf("accepted with %d processors", s.cpus)
		}
		zero := Sample{cpus: s.cpus, at: t0.Add(-time.Second)}
		for _, x := range []float64{Busy(zero, s), Busy(s, zero), Busy(s, s)} {
			if !(x >= 0 && x <= 1) {
				t.Fatalf("Busy = %v", x)
			}
		}
	})
}
