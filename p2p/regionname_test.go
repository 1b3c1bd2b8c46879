package p2p

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"
)

// TestRefusalNamesRegion: a transfer the target refuses (a wrong key)
// names the remote region by the name the initiator called it by, not
// by its wire id, over TCP and on one host.
func TestRefusalNamesRegion(t *testing.T) {
	for _, tcpOnly := range []bool{true, false} {
		a, b, ab, _ := pair(t, func(o *Options) { o.TCPOnly = tcpOnly })
		ctx := ctxT(t, 20*time.Second)
		tr, _ := b.Register("kv", make([]byte, 1<<20))
		lr, _ := a.Register("l", make([]byte, 1<<20))
		rr := tr.Remote()
		rr.Key++
		err := ab.Write([]Op{{Local: lr, Remote: rr, Len: 256 << 10}}).Wait(ctx) // past the size sent over TCP on one host
		var oe *OpError
		if !errors.Is(err, ErrRefused) || !errors.As(err, &oe) || oe.Region != `"kv"` || oe.Op != "write" {
			t.Errorf("tcp-only %v: a write with a wrong key: %v; want ErrRefused naming region \"kv\"", tcpOnly, err)
		}
	}
}

// TestFailureNamesRegion: a transfer that fails without the target's
// word (its wait cut short by a deadline or a cancel, its link lost)
// names the remote region, the operation and the peer, as a refusal does.
func TestFailureNamesRegion(t *testing.T) {
	for _, tc := range []struct {
		how  string
		want error
		end  func(c net.Conn, cancel context.CancelFunc)
		wait time.Duration
	}{
		{"deadline", ErrTimeout, func(net.Conn, context.CancelFunc) {}, 200 * time.Millisecond},
		{"cancel", ErrCancelled, func(_ net.Conn, cancel context.CancelFunc) { cancel() }, time.Minute},
		{"peer lost", ErrPeerLost, func(c net.Conn, _ context.CancelFunc) { c.Close() }, time.Minute},
	} {
		ctx := ctxT(t, 20*time.Second)
		a := endpoint(t, ctx, Options{Name: "a", Auth: testAuth(), Channels: 1})
		p, c, rr := fakeTarget(t, a)
		lr, _ := a.Register("l", make([]byte, 4096))
		wctx, cancel := context.WithTimeout(ctx, tc.wait)
		f := p.Read([]Op{{Local: lr, Remote: rr, Len: 64}})
		tc.end(c, cancel)
		err := f.Wait(wctx)
		cancel()
		var oe *OpError
		if !errors.Is(err, tc.want) || !errors.As(err, &oe) || oe.Region != `"m"` || oe.Op != "read" || oe.Peer != "evil" {
			t.Errorf("%s: %v; want %v of read, peer \"evil\", region \"m\"", tc.how, err, tc.want)
		}
		if tc.want == ErrPeerLost { // and a call started on the lost link
			err := p.Read([]Op{{Local: lr, Remote: rr, Len: 64}}).Wait(ctx)
			if !errors.Is(err, ErrPeerLost) || !errors.As(err, &oe) || oe.Region != `"m"` {
				t.Errorf("a read on the lost link: %v; want ErrPeerLost naming region \"m\"", err)
			}
		}
	}
}
