package rendezvous

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestCallExpiredWaitingForLock: a call whose deadline passes while
// another call of the same client holds the connection (a Get blocked on a
// key) ends by its own deadline with ErrTimeout, sends nothing, and leaves
// the connection usable: it must not wait out the other call, nor then
// send a request whose socket deadline has already passed (the write
// fails and the client gives the connection up, every later call failing
// "connection to store lost").
func TestCallExpiredWaitingForLock(t *testing.T) {
	s, dial := start(t)
	c := dial()
	const hold = 3 * time.Second // longer than d + answerSlack
	held := make(chan error, 1)
	go func() {
		_, err := c.Get(ctxT(t, hold), "never")
		held <- err
	}()
	waitFor(t, s, "one request waiting", func() bool { return s.waiting == 1 })
	for _, tc := range []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"set", func(ctx context.Context) error { return c.Set(ctx, "k", []byte("v")) }},
		{"get", func(ctx context.Context) error { _, err := c.Get(ctx, "k2"); return err }},
	} {
		const d = 200 * time.Millisecond
		begin := time.Now()
		err := tc.call(ctxT(t, d))
		took := time.Since(begin)
		if !errors.Is(err, ErrTimeout) {
			t.Errorf("%s behind a blocked call: %v, want ErrTimeout", tc.name, err)
		}
		if took > d+time.Second {
			t.Errorf("%s with a %v deadline took %v behind a blocked call", tc.name, d, took.Round(time.Millisecond))
		}
	}
	if err := <-held; !errors.Is(err, ErrTimeout) {
		t.Fatalf("the blocked get: %v, want ErrTimeout", err)
	}
	if err := c.Set(ctxT(t, 5*time.Second), "k", []byte("v")); err != nil {
		t.Fatalf("set after calls that expired waiting for the connection: %v", err)
	}
}
