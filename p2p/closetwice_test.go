package p2p

import (
	"errors"
	"testing"
	"time"
)

// TestMisuseCloseTwiceKeepsError: a Close that gives up on a same-host
// copy held up in the kernel returns ErrTimeout (this side's memory may
// still be written); a second Close, called at once, must not return nil,
// which tells the caller that the memory is free to reuse. Once the copy
// has returned (its pages came), Close says so: nil.
func TestMisuseCloseTwiceKeepsError(t *testing.T) {
	u := newUffdTargetOpts(t, Options{Name: "a", Auth: testAuth(), Channels: 1, Heartbeat: time.Second})
	stalledRead(t, u, 5*time.Second)
	first := u.a.Close()
	if !errors.Is(first, ErrTimeout) {
		t.Fatalf("the first Close: %v, want ErrTimeout", first)
	}
	if second := u.a.Close(); !errors.Is(second, ErrTimeout) {
		t.Errorf("the second Close: %v, want the first's ErrTimeout (%v)", second, first)
	}
	eventually(t, "Close to return nil once the pages came", func() bool { return u.a.Close() == nil })
}
