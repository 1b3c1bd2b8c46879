package p2p

import (
	"net"
	"testing"
	"time"
)

// TestSilentFloodDoesNotLockOutMembers: connections that never prove
// anything (anyone who reaches the port can open them) must not keep a
// member from linking for as long as the flood goes on, as the store's and
// the transport's listeners make sure by evicting the oldest silent one.
func TestSilentFloodDoesNotLockOutMembers(t *testing.T) {
	defer func(n int) { maxHandshakes = n }(maxHandshakes)
	maxHandshakes = 8 // the same with 4096: the flood needs twice as many
	_, st := storeFor(t)
	ctx := ctxT(t, 30*time.Second)
	a := published(t, ctx, st, "a", nil)
	b := published(t, ctx, st, "b", nil)
	stop := make(chan struct{})
	done := make(chan struct{})
	defer func() { close(stop); <-done }()
	go func() { // the attacker: silent connections, always more than the slots
		defer close(done)
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if len(conns) < 3*maxHandshakes {
				c, err := net.DialTimeout("tcp", a.Addr(), 100*time.Millisecond)
				if err == nil {
					conns = append(conns, c)
					continue
				}
			}
			// Drop the ones the endpoint gave up on (it closed them).
			live := conns[:0]
			for _, c := range conns {
				c.SetReadDeadline(time.Now().Add(time.Microsecond))
				var b [64]byte
				if _, err := c.Read(b[:]); err != nil && !isTimeout(err) {
					c.Close()
					continue
				}
				live = append(live, c)
			}
			conns = live
			time.Sleep(5 * time.Millisecond)
		}
	}()
	time.Sleep(time.Second) // the flood is on
	t0 := time.Now()
	_, err := b.Connect(ctxT(t, 20*time.Second), "a")
	t.Logf("Connect took %v", time.Since(t0).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("a member cannot link while unproven connections flood the port (after %v): %v", time.Since(t0).Round(time.Millisecond), err)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}
