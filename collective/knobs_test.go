package collective_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/collective"
)

// TestKnobsDiffer: a knob that changes how the ranks talk (connections per
// peer pair, the algorithm, the shape of a node's shared memory) set
// differently on some ranks fails Init on every rank at once, as
// ErrInvalid naming the knob, the first rank that differs from the
// reference (rank 0, or the node's first rank) and both values, in the
// same words everywhere.
func TestKnobsDiffer(t *testing.T) {
	for _, tc := range []struct {
		name           string
		nodes, perNode int
		tune           func(*collective.Options)
		want           string
		peer           int // the differing rank (on it, the reference)
	}{
		{"channels", 2, 1, func(o *collective.Options) {
			if o.Rank == 1 {
				o.Channels = 8
			}
		}, "SLIME_CHANNELS differs: rank 0 has 4, rank 1 has 8", 1},
		{"algo", 2, 2, func(o *collective.Options) {
			if o.NodeRank == 1 {
				o.Algo = "ring"
			}
		}, "SLIME_ALGO differs: rank 0 has hier (auto), rank 2 has ring", 2},
		{"slot-bytes", 1, 2, func(o *collective.Options) {
			if o.Rank == 1 {
				o.SlotBytes = 512 << 10
			}
		}, "SLIME_SLOT_BYTES differs on node 0: rank 0 has 262144, rank 1 has 524288", 1},
		// A world size that differs changes which ranks a rank waits
		// for: the rank that expects one more would wait for it until
		// the timeout, and the others for that rank.
		{"world-size-0", 1, 2, func(o *collective.Options) {
			if o.Rank == 0 {
				o.WorldSize = 3
			}
		}, "WORLD_SIZE differs: rank 0 has 3, rank 1 has 2", 1},
		{"world-size-1", 2, 1, func(o *collective.Options) {
			if o.Rank == 1 {
				o.WorldSize = 3
			}
		}, "WORLD_SIZE differs: rank 0 has 2, rank 1 has 3", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const timeout = 20 * time.Second
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			start := time.Now()
			errs := collective.RunInProcess(ctx, tc.nodes, tc.perNode, func(o *collective.Options) {
				o.Timeout = timeout
				tc.tune(o)
			}, func(c *collective.Communicator) error { return errors.New("Init succeeded") })
			took := time.Since(start)
			for r, err := range errs {
				var oe *collective.OpError
				peer := tc.peer
				if r == tc.peer {
					peer = 0
				}
				if !errors.Is(err, collective.ErrInvalid) || !errors.As(err, &oe) || oe.Op != "init" || oe.Peer != peer || !strings.Contains(oe.Detail, tc.want) {
					t.Errorf("rank %d: %v; want ErrInvalid at init naming peer %d and %q", r, err, peer, tc.want)
				}
			}
			if took > timeout/2 {
				t.Errorf("Init took %v to fail (timeout %v): not at once", took, timeout)
			}
		})
	}
}
