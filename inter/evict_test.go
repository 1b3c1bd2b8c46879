package inter

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"
)

// TestTransportSustainedFlood: a foreign party keeps MaxPendingHandshakes
// silent connections open at all times, opening a new one shortly after
// one closes (a flood of SYNs at full rate is a different attack, which
// no accept loop answers). The real peer still gets in within a few seconds, well inside a
// timeout that the handshake deadline alone would exhaust: a handshake
// that has lasted EvictAfter gives its place to a new connection.
func TestTransportSustainedFlood(t *testing.T) {
	const timeout = 8 * time.Second
	st := testStore(t, 3)
	cfg1 := rankConfig(st[1], 1, testKey, timeout)
	// Silent connections would hold their slots to the end without
	// eviction.
	cfg1.HandshakeTimeout = timeout
	acceptor := start(t, cfg1)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	addr, err := st[2].Get(ctx, "t/addr/1")
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range MaxPendingHandshakes + 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := net.DialTimeout("tcp", string(addr), time.Second)
				if err != nil {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				// Silent until the acceptor drops it, then again.
				c.SetReadDeadline(time.Now().Add(timeout))
				var b [64]byte
				for {
					if _, err := c.Read(b[:]); err != nil {
						break
					}
				}
				c.Close()
				time.Sleep(50 * time.Millisecond)
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()
	time.Sleep(200 * time.Millisecond) // the flood fills the pending slots
	dialer := start(t, rankConfig(st[0], 0, testKey, timeout))
	for r, c := range []<-chan started{dialer, acceptor} {
		s := await(t, c, timeout+5*time.Second)
		if s.err != nil {
			t.Fatalf("rank %d under a sustained flood: %v", r, s.err)
		}
		defer s.tr.Close()
	}
}
