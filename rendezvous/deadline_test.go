package rendezvous

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/auth"
	"github.com/slimego/slimego/internal/testbin"
)

// hungStore listens on loopback, passes the handshake of every connection
// and then reads what it is sent without ever answering: a store whose
// host stopped (SIGSTOP) after the client connected, or whose node's link
// went down.
func hungStore(t *testing.T, a Auth) string {
	t.Helper()
	return testbin.Serve(t, func(c net.Conn) {
		if auth.Accept(c, a.key(), purpose, time.Now().Add(5*time.Second)) == nil {
			io.Copy(io.Discard, c)
		}
	})
}

// TestCallEndsByDeadlineOnHungStore: a call that the store answers at once
// (it never waits for a key) ends by its context's deadline and the answer
// slack when the store does not answer at all: bounded, ErrConnLost. (The
// slack is theirs too: without it a live store answering a moment late
// cost the connection, and a rank's next wait failed at once.)
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
			if took > d+answerSlack+time.Second {
				t.Errorf("took %v with a %v context: %v", took.Round(time.Millisecond), d, err)
			}
			if !errors.Is(err, ErrConnLost) {
				t.Errorf("err = %v, want ErrConnLost", err)
			}
		})
	}
}

// TestExpiredCallKeepsConnection: a call made with a context whose
// deadline has passed fails with ErrTimeout before anything is sent, and
// the connection stays usable for the next call (the socket's deadline,
// set in the past, failed the write and gave the connection up: the next
// call, with time to spare, failed "connection to store lost").
func TestExpiredCallKeepsConnection(t *testing.T) {
	a := Auth{Secret: []byte("s3cret"), Job: "job"}
	s, err := Listen("127.0.0.1:0", ServerConfig{Auth: a})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, s.Addr().String(), a)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	gone, cancelGone := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancelGone()
	for name, call := range map[string]func(context.Context) error{
		"set":   func(ctx context.Context) error { return c.Set(ctx, "k", []byte("v")) },
		"add":   func(ctx context.Context) error { _, err := c.Add(ctx, "n", 1); return err },
		"check": func(ctx context.Context) error { _, err := c.Check(ctx, "k"); return err },
		"get":   func(ctx context.Context) error { _, err := c.Get(ctx, "k"); return err },
	} {
		if err := call(gone); !errors.Is(err, ErrTimeout) {
			t.Errorf("%s with an expired context: %v, want ErrTimeout", name, err)
		}
		if err := c.Set(ctx, "k", []byte("v")); err != nil {
			t.Fatalf("set after %s with an expired context: %v", name, err)
		}
	}
}
