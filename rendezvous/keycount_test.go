package rendezvous

import (
	"errors"
	"testing"
	"time"
)

// TestWaitTooManyKeys: the wire carries a frame's key count in 16 bits; a
// Wait or Check on more keys is refused at once (ErrBadRequest, naming
// the count) and sends nothing, so that the connection stays usable. (It
// sent the count cut to 16 bits: the store read a malformed frame and
// hung up, and the caller saw "connection to store lost".)
func TestWaitTooManyKeys(t *testing.T) {
	_, dial := start(t)
	c := dial()
	keys := make([]string, 1<<16+1)
	for i := range keys {
		keys[i] = "k"
	}
	if err := c.Wait(ctxT(t, 5*time.Second), keys...); !errors.Is(err, ErrBadRequest) {
		t.Errorf("wait on %d keys: %v, want ErrBadRequest", len(keys), err)
	}
	if _, err := c.Check(ctxT(t, 5*time.Second), keys...); !errors.Is(err, ErrBadRequest) {
		t.Errorf("check on %d keys: %v, want ErrBadRequest", len(keys), err)
	}
	if err := c.Barrier(ctxT(t, 5*time.Second), "b", 0, len(keys)); !errors.Is(err, ErrBadRequest) {
		t.Errorf("barrier of %d members: %v, want ErrBadRequest", len(keys), err)
	}
	if err := c.Set(ctxT(t, 5*time.Second), "k", []byte("v")); err != nil {
		t.Fatalf("set after the refused calls: %v", err)
	}
	if err := c.Wait(ctxT(t, 5*time.Second), keys[:1<<16-1]...); err != nil {
		t.Errorf("wait on %d keys, the most a frame carries: %v", 1<<16-1, err)
	}
}
