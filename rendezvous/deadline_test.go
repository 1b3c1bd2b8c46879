package rendezvous

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/auth"
)

// hungStore listens on loopback, passes the handshake of every connection
// and then reads what it is sent without ever answering: a store whose
// host stopped (SIGSTOP) after the client connected, or whose node's link
// went down.
func hungStore(t *testing.T, a Auth) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
			go func() {
				if auth.Accept(c, a.key(), purpose, time.Now().Add(5*time.Second)) == nil {
					io.Copy(io.Discard, c)
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// TestCallEndsByDeadlineOnHungStore: a call that the store answers at once
// (it never waits for a key) ends by its context's deadline when the
// store does not answer at all. The slack that lets a blocking call's own
// timeout answer arrive from the server is not theirs: it made a Set with
// a 1 s context take 3 s, and so a rank whose node lost its link reported
// its operation's error 3 s after its timeout (collective's blame record).
func TestCallEndsByDeadlineOnHungStore(t *testing.T) {
	a := Auth{Secret: []byte("s"), Job: "j"}
	addr := hungStore(t, a)
	const d = 300 * time.Millisecond
	for _, tc := range []struct {
		name string
		call func(ctx context.Context, c *Client) error
	}{
		{"set", func(ctx context.Context, c *Client) error { return c.Set(ctx, "k", []byte("v")) }},
		{"add", func(ctx context.Context, c *Client) error { _, err := c.Add(ctx, "k", 1); return err }},
		{"cas", func(ctx context.Context, c *Client) error {
			_, _, err := c.CompareAndSet(ctx, "k", nil, []byte("v"))
			return err
		}},
		{"check", func(ctx context.Context, c *Client) error { _, err := c.Check(ctx, "k"); return err }},
		{"delete", func(ctx context.Context, c *Client) error { _, err := c.Delete(ctx, "k"); return err }},
		{"numkeys", func(ctx context.Context, c *Client) error { _, err := c.NumKeys(ctx); return err }},
		{"abort", func(ctx context.Context, c *Client) error { return c.Abort(ctx, "p/", 1, "why") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Dial(ctxT(t, 5*time.Second), addr, a)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			start := time.Now()
			err = tc.call(ctxT(t, d), c)
			took := time.Since(start)
			if err == nil {
				t.Fatal("a store that never answers: the call succeeded")
			}
			if took > d+500*time.Millisecond {
				t.Errorf("took %v with a %v context: %v", took.Round(time.Millisecond), d, err)
			}
			if !errors.Is(err, ErrConnLost) {
				t.Errorf("err = %v, want ErrConnLost", err)
			}
		})
	}
}
