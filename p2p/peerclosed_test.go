package p2p

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestPeerClosedMidTransfer: transfers in flight, or started, while the
// peer's endpoint closes fail as the peer gone (ErrPeerLost or ErrClosed),
// on every transport alike: on one host they failed as refused, "no such
// region (never registered, or deregistered)" (the close deregisters its
// regions first), which reads as a program's mistake, where over TCP the
// same close was ErrPeerLost.
func TestPeerClosedMidTransfer(t *testing.T) {
	for _, tcpOnly := range []bool{false, true} {
		for iter := range 8 {
			a, b, _, ba := pair(t, func(o *Options) { o.TCPOnly = tcpOnly })
			const n = 1 << 20
			ra, err := a.Register("mem", make([]byte, n))
			if err != nil {
				t.Fatal(err)
			}
			lb, err := b.Register("src", make([]byte, n))
			if err != nil {
				t.Fatal(err)
			}
			rr := ra.Remote()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			done := make(chan error, 1)
			wrote := make(chan struct{})
			go func() {
				for i := 0; ; i++ {
					err := ba.Write([]Op{{Local: lb, Remote: rr, Len: n}}).Wait(ctx)
					if i == 0 {
						close(wrote)
					}
					if err != nil {
						done <- err
						return
					}
				}
			}()
			<-wrote
			time.Sleep(time.Duration(iter) * time.Millisecond)
			a.Close()
			err = <-done
			cancel()
			if !errors.Is(err, ErrPeerLost) && !errors.Is(err, ErrClosed) {
				t.Errorf("tcpOnly %v, try %d: a write as the peer closed: %v; want ErrPeerLost or ErrClosed", tcpOnly, iter, err)
			}
			b.Close()
		}
	}
}
