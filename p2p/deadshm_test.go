package p2p

import (
	"errors"
	"testing"
	"time"
)

// TestSharedPeerKilled: once the link to a killed peer whose Shared
// memory this side copies through its own mapping (which outlives the
// process) has failed, every write started is refused with ErrPeerLost,
// not copied into the dead peer's memory and reported done. (A copy
// already running when the link fails reports the link's error too, by
// leaseCopy's and the grant's check after the copy; that race has no
// deterministic test.)
func TestSharedPeerKilled(t *testing.T) {
	const size = 64 << 20
	addr, st := storeFor(t)
	cmd := startChild(t, "shared-target", addr, size, 1)
	ctx := ctxT(t, 60*time.Second)
	e := endpoint(t, ctx, Options{Name: "parent", Store: st, Auth: testAuth()})
	p, err := e.Connect(ctx, "child")
	if err != nil {
		t.Fatal(err)
	}
	rr, _ := p.Remote("mem")
	lr, _ := e.Register("l", make([]byte, size))
	for range 3 { // the lease comes up
		if err := p.Write([]Op{{Local: lr, Remote: rr, Len: 1 << 20}}).Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	gone := p.Recv(make([]byte, 1)) // fails when the link does
	killed := time.Now()
	cmd.Process.Kill()
	var late, after int
	for time.Since(killed) < 1500*time.Millisecond {
		down := false
		select {
		case <-gone.Done():
			down = true // the link has failed: this write starts after
		default:
		}
		f := p.Write([]Op{{Local: lr, Remote: rr, Len: size}}) // 64 MiB: in a goroutine, through the mapping
		err := f.Wait(ctx)
		if down {
			after++
			if err == nil {
				late++
			} else if !errors.Is(err, ErrPeerLost) {
				t.Fatalf("a write after the link failed: %v, want ErrPeerLost", err)
			}
		}
		if err != nil && !errors.Is(err, ErrPeerLost) {
			t.Fatalf("a write as the peer is killed: %v, want nil or ErrPeerLost", err)
		}
	}
	if after == 0 {
		t.Fatal("the link did not fail within 1.5 s of the kill")
	}
	if late > 0 {
		t.Fatalf("%d writes into the killed peer's memory ended with nil after the link had failed", late)
	}
	if err := gone.Wait(ctx); !errors.Is(err, ErrPeerLost) {
		t.Fatalf("the Recv: %v, want ErrPeerLost", err)
	}
}
