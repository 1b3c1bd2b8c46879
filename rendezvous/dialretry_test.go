package rendezvous

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"
)

// TestDialRetriesFullStore: a store at its connection limit closes a new
// connection before the handshake's verdict. That is no refusal: Dial
// retries until a slot frees, and only a wrong secret is ErrDenied.
func TestDialRetriesFullStore(t *testing.T) {
	a := Auth{Secret: []byte("s"), Job: "j"}
	s, err := Listen("127.0.0.1:0", ServerConfig{Auth: a, MaxConns: 2, HandshakeTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	addr := s.Addr().String()
	var idle []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	// The slots free a little later, as a real client's would.
	go func() {
		time.Sleep(300 * time.Millisecond)
		for _, c := range idle {
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := Dial(ctx, addr, a)
	if err != nil {
		t.Fatalf("Dial of a full store that frees a slot: %v", err)
	}
	c.Close()
	start := time.Now()
	_, err = Dial(ctx, addr, Auth{Secret: []byte("other"), Job: "j"})
	if !errors.Is(err, ErrDenied) || time.Since(start) > 5*time.Second {
		t.Fatalf("a wrong secret: %v after %v, want ErrDenied at once", err, time.Since(start))
	}
}
