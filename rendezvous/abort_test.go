package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestAbortWakesWaiters: ranks blocked in Get, Wait and Barrier on keys
// under an aborted prefix fail within a second of another client's Abort,
// with an *AbortError carrying the prefix, rank and reason; keys that exist
// still read, and waits under other prefixes keep waiting.
func TestAbortWakesWaiters(t *testing.T) {
	const prefix = "slimego/run/"
	cases := []struct {
		name string
		call func(ctx context.Context, c *Client) error
	}{
		{"get", func(ctx context.Context, c *Client) error { _, err := c.Get(ctx, prefix+"never"); return err }},
		{"wait", func(ctx context.Context, c *Client) error { return c.Wait(ctx, prefix+"present", prefix+"never") }},
		{"barrier", func(ctx context.Context, c *Client) error { return c.Barrier(ctx, prefix+"b", 0, 2) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, dial := start(t)
			waiter, other, launcher := dial(), dial(), dial()
			ctx := ctxT(t, 30*time.Second)
			if err := launcher.Set(ctx, prefix+"present", []byte("v")); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- tc.call(ctx, waiter) }()
			otherDone := make(chan error, 1)
			go func() { _, err := other.Get(ctx, "slimego/other/never"); otherDone <- err }()
			// The waiter is blocked once the server holds its request;
			// nothing observable marks that, so give it a moment and
			// check that it has not returned.
			select {
			case err := <-done:
				t.Fatalf("%s returned %v before the abort", tc.name, err)
			case <-time.After(50 * time.Millisecond):
			}
			if err := launcher.Abort(ctx, prefix, 3, "exited with status 1"); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				var ae *AbortError
				if !errors.As(err, &ae) || !errors.Is(err, ErrAborted) {
					t.Fatalf("%s: err = %v, want an *AbortError", tc.name, err)
				}
				if ae.Prefix != prefix || ae.Rank != 3 || ae.Reason != "exited with status 1" {
					t.Fatalf("AbortError = %+v", *ae)
				}
				if tc.name == "barrier" {
					var me *MissingError
					if !errors.As(err, &me) || fmt.Sprint(me.Missing) != "[1]" {
						t.Fatalf("barrier err = %v, want a *MissingError naming member 1", err)
					}
				}
			case <-time.After(time.Second):
				t.Fatalf("%s still blocked a second after Abort", tc.name)
			}
			// Satisfied keys still read; non-blocking ops still work.
			if v, err := launcher.Get(ctx, prefix+"present"); err != nil || string(v) != "v" {
				t.Fatalf("Get of an existing key after abort = %q, %v", v, err)
			}
			if err := launcher.Set(ctx, prefix+"new", nil); err != nil {
				t.Fatal(err)
			}
			if err := launcher.Wait(ctx, prefix+"new", prefix+"present"); err != nil {
				t.Fatalf("Wait on existing keys after abort: %v", err)
			}
			// A later wait under the prefix fails at once.
			if _, err := launcher.Get(ctx, prefix+"later"); !errors.Is(err, ErrAborted) {
				t.Fatalf("later Get: %v, want ErrAborted", err)
			}
			// The other prefix is unaffected: still blocked, then satisfied.
			select {
			case err := <-otherDone:
				t.Fatalf("Get under another prefix returned %v after the abort", err)
			default:
			}
			if err := launcher.Set(ctx, "slimego/other/never", nil); err != nil {
				t.Fatal(err)
			}
			if err := <-otherDone; err != nil {
				t.Fatalf("Get under another prefix: %v", err)
			}
		})
	}
}

// TestServerAbortAndLookup: the hosting process aborts through the Server
// itself, aborts of several prefixes accumulate, and Lookup reads without
// waiting.
func TestServerAbortAndLookup(t *testing.T) {
	s, dial := start(t)
	c := dial()
	ctx := ctxT(t, 10*time.Second)
	if err := c.Set(ctx, "a/k", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if v, ok := s.Lookup("a/k"); !ok || string(v) != "x" {
		t.Fatalf("Lookup = %q, %v", v, ok)
	}
	if _, ok := s.Lookup("a/missing"); ok {
		t.Fatal("Lookup found a missing key")
	}
	done := make(chan error, 1)
	go func() { done <- c.Wait(ctx, "b/k") }()
	s.Abort("a/", 1, "first")
	s.Abort("b/", 2, "second")
	select {
	case err := <-done:
		var ae *AbortError
		if !errors.As(err, &ae) || ae.Prefix != "b/" || ae.Rank != 2 || ae.Reason != "second" {
			t.Fatalf("err = %v", err)
		}
	case <-time.After(time.Second):
		t.Fatal("Wait still blocked a second after Server.Abort")
	}
	for _, tc := range []struct {
		key  string
		rank int
	}{{"a/missing", 1}, {"b/missing", 2}} {
		var ae *AbortError
		if _, err := c.Get(ctx, tc.key); !errors.As(err, &ae) || ae.Rank != tc.rank {
			t.Errorf("Get(%s) = %v, want abort by rank %d", tc.key, err, tc.rank)
		}
	}
	// Bounded: after maxAborts more prefixes the first is forgotten.
	for i := range maxAborts {
		s.Abort(fmt.Sprintf("z%d/", i), 0, "fill")
	}
	if n := len(s.aborts); n != maxAborts {
		t.Fatalf("%d aborted prefixes kept, want %d", n, maxAborts)
	}
	if _, err := c.Get(ctxT(t, 50*time.Millisecond), "a/missing"); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Get under the forgotten prefix: %v, want ErrTimeout", err)
	}
}

// TestServerSet: a key the hosting process sets wakes a client waiting on
// it and reads back; a key over MaxKeyBytes, or a value over the
// server's limit, is refused and stores nothing.
func TestServerSet(t *testing.T) {
	s, dial := startCfg(t, ServerConfig{MaxValueBytes: 16})
	c := dial()
	ctx := ctxT(t, 10*time.Second)
	done := make(chan error, 1)
	go func() { done <- c.Wait(ctx, "run/0/end") }()
	time.Sleep(50 * time.Millisecond) // the wait is in the server
	if err := s.Set("run/0/end", []byte("ok")); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Wait: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait still blocked 5 s after Server.Set")
	}
	if v, err := c.Get(ctx, "run/0/end"); err != nil || string(v) != "ok" {
		t.Fatalf("Get = %q, %v", v, err)
	}
	long := strings.Repeat("k", MaxKeyBytes+1)
	for _, kv := range []struct{ k, v string }{{long, ""}, {"big", strings.Repeat("v", 17)}} {
		if err := s.Set(kv.k, []byte(kv.v)); !errors.Is(err, ErrBadRequest) {
			t.Errorf("Set of a %d-byte key and a %d-byte value: %v, want ErrBadRequest", len(kv.k), len(kv.v), err)
		}
		if _, ok := s.Lookup(kv.k); ok {
			t.Errorf("a refused %d-byte key was stored", len(kv.k))
		}
	}
}
