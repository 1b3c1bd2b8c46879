package p2p

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestMisuseLongNameErrors: Register and Connect given a name of 10 KB
// (or one with odd bytes) fail with ErrInvalid in an error of one short
// line that names the call, not one that repeats the whole name.
func TestMisuseLongNameErrors(t *testing.T) {
	_, st := storeFor(t)
	ctx := ctxT(t, 20*time.Second)
	a := published(t, ctx, st, "a", nil)
	long := strings.Repeat("x", 10<<10)
	_, err := a.Register(long, make([]byte, 8))
	if !errors.Is(err, ErrInvalid) || len(err.Error()) > 300 || !strings.Contains(err.Error(), "register") {
		t.Errorf("Register of a 10 KB name: %d bytes of error: %.200v", len(err.Error()), err)
	}
	_, err = a.Register(long+"\n/", make([]byte, 8))
	if !errors.Is(err, ErrInvalid) || strings.Contains(err.Error(), "\n") {
		t.Errorf("Register of a name with a newline and '/': %.200q", err)
	}
	_, err = a.Connect(ctx, long)
	if !errors.Is(err, ErrInvalid) || len(err.Error()) > 300 || !strings.Contains(err.Error(), "connect") {
		t.Errorf("Connect to a 10 KB name: %d bytes of error: %.200v", len(err.Error()), err)
	}
	_, err = a.Connect(ctx, "x/y")
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "'/'") {
		t.Errorf("Connect to a name with '/': %v, want ErrInvalid saying what is wrong", err)
	}
}
