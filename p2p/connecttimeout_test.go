package p2p

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestMisuseConnectTimeoutSentinel: Connect to a name never published,
// whose context's deadline passes, fails with ErrTimeout (its doc), not
// ErrPeerLost: the store's read deadline, set from ctx's, may fire before
// ctx's own timer.
func TestMisuseConnectTimeoutSentinel(t *testing.T) {
	_, st := storeFor(t)
	ctx := ctxT(t, 60*time.Second)
	a := published(t, ctx, st, "a", nil)
	bad := 0
	var last error
	for range 20 {
		cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		_, err := a.Connect(cctx, "nobody")
		cancel()
		if !errors.Is(err, ErrTimeout) {
			bad++
			last = err
		}
	}
	if bad > 0 {
		t.Errorf("%d of 20 Connects whose deadline passed did not fail with ErrTimeout; the last: %v", bad, last)
	}
}
