package rendezvous

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/auth"
	"github.com/slimego/slimego/internal/testbin"
)

// oddStore passes the handshake and answers every call with status code:
// a newer or faulty store.
func oddStore(t *testing.T, a Auth, code uint8) string {
	t.Helper()
	return testbin.Serve(t, func(c net.Conn) {
		if auth.Accept(c, a.key(), purpose, time.Now().Add(5*time.Second)) != nil {
			return
		}
		var buf []byte
		for {
			if _, err := readFrame(c, &buf, 1<<20); err != nil {
				return
			}
			m := message{Code: code}
			if _, err := c.Write(m.encode(nil)); err != nil {
				return
			}
		}
	})
}

// TestUnexpectedStatusFails: a call answered with a status it does not
// expect fails with ErrBadAnswer (a Set, an Add or an Abort answered "not
// found" did not happen); Get does not return an empty value, and Wait and
// Barrier do not succeed on it as if every key were there (a store that answers "not found" or a status
// added later would otherwise let a barrier pass with members missing),
// and Check reports "missing" only for statusFalse.
func TestUnexpectedStatusFails(t *testing.T) {
	a := Auth{Secret: []byte("s"), Job: "j"}
	for _, code := range []uint8{statusNotFound, statusFalse, 200} {
		addr := oddStore(t, a, code)
		c, err := Dial(ctxT(t, 5*time.Second), addr, a)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := c.Wait(ctx, "k"); !errors.Is(err, ErrBadAnswer) {
			t.Errorf("status %d: Wait: %v, want ErrBadAnswer", code, err)
		}
		if v, err := c.Get(ctx, "k"); !errors.Is(err, ErrBadAnswer) {
			t.Errorf("status %d: Get: %q, %v, want ErrBadAnswer", code, v, err)
		}
		if err := c.Set(ctx, "k", nil); !errors.Is(err, ErrBadAnswer) {
			t.Errorf("status %d: Set: %v, want ErrBadAnswer", code, err)
		}
		if _, err := c.Add(ctx, "n", 1); !errors.Is(err, ErrBadAnswer) {
			t.Errorf("status %d: Add: %v, want ErrBadAnswer", code, err)
		}
		if err := c.Abort(ctx, "p/", 1, "why"); !errors.Is(err, ErrBadAnswer) {
			t.Errorf("status %d: Abort: %v, want ErrBadAnswer", code, err)
		}
		if _, err := c.Delete(ctx, "k"); (code == statusNotFound) != (err == nil) {
			t.Errorf("status %d: Delete: %v", code, err)
		}
		if err := c.Barrier(ctx, "b", 0, 2); err == nil {
			t.Errorf("status %d: Barrier passed", code)
		}
		ok, err := c.Check(ctx, "k")
		if code == statusFalse {
			if ok || err != nil {
				t.Errorf("status %d: Check: %v, %v, want false, nil", code, ok, err)
			}
		} else if !errors.Is(err, ErrBadAnswer) {
			t.Errorf("status %d: Check: %v, %v, want ErrBadAnswer", code, ok, err)
		}
	}
}
