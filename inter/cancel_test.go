package inter

import (
	"context"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/fault"
)

// TestWatch: the watch on a call's context interrupts the transport when
// the context is cancelled during the call, or was before it began, and
// then only; a deadline, a cancel between calls, and a later call under
// another context (or none) are not taken for one. Watching the same
// context call after call allocates nothing.
func TestWatch(t *testing.T) {
	fresh := func() *Transport { return &Transport{peers: map[int]*peer{}} }
	eventually := func(t *testing.T, tr *Transport, want bool, what string) {
		t.Helper()
		for end := time.Now().Add(2 * time.Second); tr.interrupted.Load() != want && time.Now().Before(end); {
			time.Sleep(time.Millisecond)
		}
		if tr.interrupted.Load() != want {
			t.Fatalf("%s: interrupted %v, want %v", what, !want, want)
		}
	}
	t.Run("background", func(t *testing.T) {
		tr := fresh()
		tr.Watch(context.Background())
		if tr.Cancelled() {
			t.Fatal("a call under context.Background is cancelled")
		}
		tr.Unwatch()
	})
	t.Run("cancelled during the call", func(t *testing.T) {
		tr := fresh()
		ctx, cancel := context.WithCancel(context.Background())
		tr.Watch(ctx)
		cancel()
		eventually(t, tr, true, "cancelled during the call")
		if !tr.Cancelled() {
			t.Fatal("Cancelled is false")
		}
		if tr.Unwatch() {
			t.Fatal("Unwatch of a call its cancel ended is true")
		}
	})
	t.Run("cancelled after a failure of the call's own", func(t *testing.T) {
		tr := fresh()
		ctx, cancel := context.WithCancel(context.Background())
		tr.Watch(ctx)
		// The call's own failure, recorded first (a transport without a
		// store remembers it all the same).
		tr.Record(2, fault.New("allgather", 0, 2, fault.ErrPeerLost, "rank 2 closed its connection"))
		cancel()
		eventually(t, tr, true, "cancelled after a failure")
		if tr.Cancelled() {
			t.Fatal("the cancel took the place of the call's own failure")
		}
		tr.recordMu.Lock()
		r := tr.recorded
		tr.recordMu.Unlock()
		if r == nil || r.culprit != 2 {
			t.Fatalf("the record is %+v, want rank 2's", r)
		}
		tr.Unwatch()
	})
	t.Run("cancelled between calls", func(t *testing.T) {
		tr := fresh()
		ctx, cancel := context.WithCancel(context.Background())
		tr.Watch(ctx)
		if !tr.Unwatch() {
			t.Fatal("Unwatch of a call not cancelled is false")
		}
		cancel()
		time.Sleep(20 * time.Millisecond)
		eventually(t, tr, false, "cancelled after its call")
		tr.Watch(context.Background())
		if tr.Cancelled() {
			t.Fatal("a later call under context.Background is cancelled")
		}
		tr.Unwatch()
		other, cancelOther := context.WithCancel(context.Background())
		defer cancelOther()
		tr.Watch(other)
		if tr.Cancelled() {
			t.Fatal("a later call under another context is cancelled")
		}
		tr.Unwatch()
		eventually(t, tr, false, "later calls")
		tr.Watch(ctx) // the cancelled one again: it ends at once
		eventually(t, tr, true, "a call under a context cancelled before it")
		if !tr.Cancelled() {
			t.Fatal("Cancelled is false")
		}
		tr.Unwatch()
	})
	t.Run("deadline", func(t *testing.T) {
		tr := fresh()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
		defer cancel()
		tr.Watch(ctx)
		<-ctx.Done()
		time.Sleep(20 * time.Millisecond)
		eventually(t, tr, false, "past the deadline")
		if tr.Cancelled() {
			t.Fatal("a call past its deadline is cancelled")
		}
		tr.Unwatch()
	})
	t.Run("closed", func(t *testing.T) {
		tr := fresh()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		tr.Watch(ctx)
		tr.Unwatch()
		tr.Close()
		if tr.watch.stop() {
			t.Fatal("Close left the watch on the context registered (it keeps the transport)")
		}
	})
	t.Run("allocations", func(t *testing.T) {
		tr := fresh()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		if n := testing.AllocsPerRun(100, func() { tr.Watch(ctx); tr.Unwatch() }); n != 0 {
			t.Fatalf("a watch of the same context allocated %v times a call", n)
		}
	})
}
