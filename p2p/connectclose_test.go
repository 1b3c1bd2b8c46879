package p2p

import (
	"errors"
	"testing"
	"time"
)

// TestCloseEndsConnectWaitingForInfo: a Connect that waits in the store
// for a peer that has not published yet (a decode worker still starting)
// fails with ErrClosed once its endpoint is closed, not at its own
// deadline (Options.Timeout, 5 minutes by default) long after Close.
func TestCloseEndsConnectWaitingForInfo(t *testing.T) {
	_, st := storeFor(t)
	ctx := ctxT(t, 60*time.Second)
	a := published(t, ctx, st, "a", nil)
	errc := make(chan error, 1)
	go func() {
		_, err := a.Connect(ctx, "late")
		errc <- err
	}()
	time.Sleep(200 * time.Millisecond) // Connect is in the store's wait
	start := time.Now()
	a.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrClosed) || !isOp(err, "connect", "late") {
			t.Errorf("Connect during Close: %v, want ErrClosed naming connect and the peer", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("Connect returned %v after Close", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("Connect still waits for the peer's info 10 s after its endpoint's Close returned")
	}
	// The store client is the program's, and still works.
	b := published(t, ctx, st, "b", nil)
	published(t, ctx, st, "late", nil)
	if _, err := b.Connect(ctx, "late"); err != nil {
		t.Fatalf("the store client after Close ended a Connect: %v", err)
	}
}
