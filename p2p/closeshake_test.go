package p2p

import (
	"net"
	"testing"
	"time"
)

// TestCloseDuringHandshake: Close ends the connections still in their
// handshake (anyone who reaches the port can open one and say nothing)
// rather than wait for their HandshakeTimeout: it returns nil at once,
// not after the handshake's bound, nor ErrTimeout saying a goroutine
// outlived two heartbeats.
func TestCloseDuringHandshake(t *testing.T) {
	e, err := New(ctxT(t, 30*time.Second), Options{Name: "a", Auth: testAuth(), Heartbeat: 500 * time.Millisecond, HandshakeTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var cs []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", e.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// The acceptor speaks first: its first byte says its handshake runs.
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	start := time.Now()
	err = e.Close()
	if took := time.Since(start); err != nil || took > 5*time.Second {
		t.Fatalf("Close with %d connections in their handshake: %v after %v, want nil, well before the handshakes' bound", len(cs), err, took)
	}
}
