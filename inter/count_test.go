package inter

import (
	"errors"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/fault"
)

// TestFirstFrameCountChecked: a first frame whose count is not the length
// of its stripe (a peer out of step, or gone bad) fails the receive with
// ErrPeerLost, as a later stripe's does, whether read in the caller's
// goroutine or by the connection's: the count is the peer's word, and
// reading the stripe's length regardless took the next frame's bytes as
// data (or left bytes of this one for the next header) and reported
// success.
func TestFirstFrameCountChecked(t *testing.T) {
	big := 2 * StripeMin
	for _, tc := range []struct {
		name   string
		expect int
		frames [][]byte
	}{
		{"short, one stripe", 1000, [][]byte{frameBytes(1, 500, 1000, 1, 1000)}},
		{"short, first of two stripes", big, [][]byte{frameBytes(1, StripeMin-8, big, 2, StripeMin), frameBytes(1, StripeMin, big, 2, StripeMin)}},
		{"long, first of two stripes", big, [][]byte{frameBytes(1, big, big, 2, StripeMin), frameBytes(1, StripeMin, big, 2, StripeMin)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := pair(t, 0)
			raw := rawConns(ts[1], 0)
			buf := make([]byte, tc.expect)
			ts[0].Recv(1, 1, 7, buf, time.Now().Add(3*time.Second))
			for ch, b := range tc.frames {
				go raw[ch].Write(b)
			}
			err := ts[0].WaitRecv(1)
			if !errors.Is(err, fault.ErrPeerLost) {
				t.Fatalf("want ErrPeerLost, got %v", err)
			}
			t.Logf("%v", err)
		})
	}
}
