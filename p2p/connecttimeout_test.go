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

// TestMisusePublishContextSentinel: Publish whose context is cancelled,
// or whose deadline has passed, fails with ErrCancelled or ErrTimeout
// (the sentinels' doc), not ErrPeerLost ("the peer's process exited").
func TestMisusePublishContextSentinel(t *testing.T) {
	_, st := storeFor(t)
	ctx := ctxT(t, 20*time.Second)
	a := endpoint(t, ctx, Options{Name: "a", Auth: testAuth(), Store: st})
	dctx, cancel := context.WithTimeout(ctx, time.Nanosecond)
	defer cancel()
	time.Sleep(time.Millisecond)
	if err := a.Publish(dctx); !errors.Is(err, ErrTimeout) {
		t.Errorf("Publish past its deadline: %v, want ErrTimeout", err)
	}
	cctx, cancel2 := context.WithCancel(ctx)
	cancel2()
	if err := a.Publish(cctx); !errors.Is(err, ErrCancelled) {
		t.Errorf("Publish with a cancelled context: %v, want ErrCancelled", err)
	}
	if err := a.Publish(ctx); err != nil {
		t.Errorf("Publish after: %v", err)
	}
}
