package cpustat

import (
	"runtime"
	"testing"
	"time"
)

// TestBusy: a second of sleep is mostly idle; a second in which every
// processor spins is mostly busy. The machine is shared, so the bounds are
// loose, but a Busy that ignored the work (or the idle time) fails one.
func TestBusy(t *testing.T) {
	a, ok := Now()
	if !ok {
		t.Skip("this platform does not report idle time")
	}
	if a.cpus < runtime.NumCPU() {
		t.Errorf("%d processors in /proc/stat, %d usable", a.cpus, runtime.NumCPU())
	}
	time.Sleep(time.Second)
	b, _ := Now()
	spin := func(d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); {
		}
	}
	done := make(chan struct{})
	for range a.cpus {
		go func() { spin(time.Second); done <- struct{}{} }()
	}
	for range a.cpus {
		<-done
	}
	c, _ := Now()
	idle, busy := Busy(a, b), Busy(b, c)
	t.Logf("sleeping: %.2f busy; spinning on %d processors: %.2f busy", idle, a.cpus, busy)
	if busy < 0.8 || busy-idle < 0.5 {
		t.Errorf("busy while sleeping %.2f, while spinning %.2f", idle, busy)
	}
}
