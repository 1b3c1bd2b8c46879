package rendezvous

import (
	"errors"
	"strconv"
	"testing"
	"time"
)

// TestWaitersDoNotStallStore: a member that records maxAborts aborts of
// prefixes no key has, then parks a few Waits on 65535 missing keys each,
// must not stall everyone else's calls: each wake-up of each such waiter
// rescans keys × aborts under the server's one lock.
func TestWaitersDoNotStallStore(t *testing.T) {
	s, dial := startCfg(t, ServerConfig{})
	ctl := dial()
	for i := range maxAborts {
		if err := ctl.Abort(ctxT(t, 5*time.Second), "zz-none-"+strconv.Itoa(i)+"/", 0, "x"); err != nil {
			t.Fatal(err)
		}
	}
	keys := make([]string, MaxCallKeys)
	for i := range keys {
		keys[i] = "missing/" + strconv.Itoa(i)
	}
	frame := (&message{Code: uint8(opWait), Keys: keys, TimeoutMS: 60_000}).encode(nil)
	const waiters = 4
	for range waiters {
		c := rawConn(t, s, Auth{})
		defer c.Close()
		if _, err := c.Write(frame); err != nil {
			t.Fatal(err)
		}
	}
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		s.mu.Lock()
		w := s.waiting
		s.mu.Unlock()
		if w == waiters || time.Now().After(end) {
			break
		}
	}
	// A member sets ten keys, one after the other, as ranks publishing
	// their addresses do.
	member := dial()
	start := time.Now()
	for i := range 10 {
		if err := member.Set(ctxT(t, 30*time.Second), "rank/"+strconv.Itoa(i), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("10 Sets took %v with %d waiters on %d keys and %d aborts recorded", d, waiters, len(keys), maxAborts)
	}
}

// TestAbortAppliesToKeyDeletedDuringWait: a wait checks only the aborts
// recorded since its last wake-up, except after a delete: a key it waits
// for that existed, under a prefix aborted before the wait began, and
// was deleted while it waited, fails the wait at once as aborted.
func TestAbortAppliesToKeyDeletedDuringWait(t *testing.T) {
	_, dial := startCfg(t, ServerConfig{})
	ctl := dial()
	ctx := ctxT(t, 10*time.Second)
	if err := ctl.Set(ctx, "p/a", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := ctl.Abort(ctx, "p/", 3, "gone"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- dial().Wait(ctx, "p/a", "q/b") }()
	time.Sleep(200 * time.Millisecond) // blocked on q/b
	if ok, err := ctl.Delete(ctx, "p/a"); !ok || err != nil {
		t.Fatalf("Delete: %v %v", ok, err)
	}
	select {
	case err := <-done:
		var ae *AbortError
		if !errors.As(err, &ae) || ae.Rank != 3 {
			t.Fatalf("Wait: %v, want the abort of p/ by rank 3", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the Wait did not end after its key under an aborted prefix was deleted")
	}
}
