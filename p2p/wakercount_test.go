package p2p

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// TestWakerCountNotDrained: a waker never reads its eventfd's count, so
// that the count, once written, stays and the descriptor stays readable.
// A Wait parked on it must still sleep until the next write (the poller
// sees each write as an edge) rather than wake again and again: after a
// thousand earlier wakes, a Wait whose answer comes 200 ms later wakes a
// handful of times at most, and reads its bytes.
func TestWakerCountNotDrained(t *testing.T) {
	a := endpoint(t, ctxT(t, 20*time.Second), Options{Name: "a", Auth: testAuth(), Channels: 1, Heartbeat: 20 * time.Second})
	p, c, rr := fakeTarget(t, a)
	w := p.l.conns[0].waker
	if w == nil {
		t.Fatal("the connection has no waker")
	}
	for range 1000 {
		w.wake() // late wakes, as of Waits long returned
	}
	dst := make([]byte, 8)
	lr, _ := a.Register("dst", dst)
	f := p.Read([]Op{{Local: lr, Remote: rr, Len: len(dst)}})
	h, _ := nextFrame(t, c)
	go func() { time.Sleep(200 * time.Millisecond); answerRead(c, h, 5) }()
	parks, wakeups := w.parks.Load(), w.wakeups.Load()
	if err := f.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := w.parks.Load() - parks; n != 1 {
		t.Fatalf("the Wait parked %d times on the waker, want once", n)
	}
	if n := w.wakeups.Load() - wakeups; n > 4 {
		t.Errorf("the Wait woke %d times in 200 ms: it spins on a count it never reads", n)
	}
	want := make([]byte, 8)
	fill(want, 5)
	if !bytes.Equal(dst, want) {
		t.Fatalf("read %x, want %x", dst, want)
	}
}
