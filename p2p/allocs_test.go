package p2p

import (
	"context"
	"testing"
	"time"
)

// TestSmallReadAllocs: an 8-byte read over TCP and its Wait, under a
// context that can be cancelled, allocate the Future, its channel and
// context.AfterFunc's two objects, and nothing else on either side (both
// endpoints are in this process, so the target's serving counts too):
// the connection's writes, the request's part and descriptors and the
// region's name allocate nothing per call.
func TestSmallReadAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	mk := func(n string) *Endpoint {
		e, err := New(ctx, Options{Name: n, Auth: testAuth(), TCPOnly: true, Channels: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return e
	}
	a, c := mk("a"), mk("b")
	lr, _ := a.Register("local", make([]byte, 8))
	if _, err := c.Register("remote", make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	p, err := a.ConnectInfo(ctx, c.Info())
	if err != nil {
		t.Fatal(err)
	}
	rr, ok := p.Remote("remote")
	if !ok {
		t.Fatal("the peer's Info lists no region \"remote\"")
	}
	ops := []Op{{Local: lr, Remote: rr, Len: 8}}
	read := func() {
		if err := p.Read(ops).Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	read()
	// Heartbeats and timers allocate now and then: the mean over many
	// reads, rounded down by AllocsPerRun, counts what every read costs.
	// AfterFunc's two objects are the Go release's (1.26): a release that
	// changes them changes want.
	const want = 4
	if got := testing.AllocsPerRun(2000, read); got > want {
		t.Errorf("an 8-byte read and its Wait allocated %v times, want at most %d", got, want)
	}
}
