package p2p

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestConnectCancelKeepsStore: a Connect waiting in the store for a peer
// that has not published yet, whose context is cancelled (a request
// given up, a shutdown), fails with ErrCancelled and leaves the store
// client usable: the program's next Publish, Connect or barrier on it
// works. A store call cancelled mid-call gives its connection up for
// good, so Connect waits in slices bounded by deadlines alone.
func TestConnectCancelKeepsStore(t *testing.T) {
	_, st := storeFor(t)
	ctx := ctxT(t, 60*time.Second)
	a := published(t, ctx, st, "a", nil)
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	_, err := a.Connect(cctx, "late")
	if !errors.Is(err, ErrCancelled) || !isOp(err, "connect", "late") {
		t.Errorf("a cancelled Connect: %v, want ErrCancelled naming connect and the peer", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the cancelled Connect returned after %v", d)
	}
	published(t, ctx, st, "late", nil)
	if _, err := a.Connect(ctx, "late"); err != nil {
		t.Fatalf("Connect after a cancelled one, on the same store client: %v", err)
	}
}
