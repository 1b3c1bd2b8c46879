package p2p

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestMisuseZeroFuture: a zero Future (new(Future), or a Future field
// never set) is no transfer: Wait fails at once with ErrInvalid, as for
// a nil Future, and Done is closed; it must not block past its context
// (before, Wait blocked for good whatever its context said).
func TestMisuseZeroFuture(t *testing.T) {
	var f Future
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- f.Wait(ctx) }()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("Wait of a zero Future: %v, want ErrInvalid", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("Wait of a zero Future still blocks 5 s after its context's deadline (200 ms)")
	}
	select {
	case <-f.Done():
	default:
		t.Errorf("Done of a zero Future is not closed")
	}
}
