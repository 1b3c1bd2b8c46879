package collective

import (
	"errors"
	"fmt"
	"testing"

	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/rendezvous"
)

// TestStoreFault: each failure of the store becomes one of the package's
// sentinels, naming who caused it: the aborting rank for an abort, the
// store's host for a lost connection or an answer no call expects, the
// rank waited for otherwise.
func TestStoreFault(t *testing.T) {
	c := &Communicator{opts: Options{Job: Job{Rank: 2, MasterAddr: "127.0.0.1", MasterPort: 29500}}}
	for _, tc := range []struct {
		name string
		err  error
		want error
		peer int
	}{
		{"abort", fmt.Errorf("get: %w", &rendezvous.AbortError{Rank: 3, Reason: "rank 3 exited"}), ErrPeerLost, 3},
		{"abort, set up apart", fmt.Errorf("get: %w", &rendezvous.AbortError{Rank: 1, Reason: abortInvalid + "sizes differ"}), ErrInvalid, 1},
		{"connection lost", fmt.Errorf("%w: x", rendezvous.ErrConnLost), ErrPeerLost, 0},
		{"answer no call expects", fmt.Errorf("%w: x", rendezvous.ErrBadAnswer), ErrPeerLost, 0},
		{"denied", fmt.Errorf("%w: x", rendezvous.ErrDenied), ErrInvalid, -1},
		{"timeout", fmt.Errorf("%w: x", rendezvous.ErrTimeout), ErrTimeout, 5},
	} {
		err := c.storeFault("init", tc.err, 5, "joining the job")
		var oe *fault.OpError
		if !errors.Is(err, tc.want) || !errors.As(err, &oe) || oe.Peer != tc.peer || oe.Rank != 2 {
			t.Errorf("%s: %v, want %v naming peer %d", tc.name, err, tc.want, tc.peer)
		}
	}
}
