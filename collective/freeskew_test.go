package collective_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/slimego/slimego/collective"
)

// TestSymmetricSourceFreedOnOneRank: ranks 0 and 1 gather from a
// symmetric buffer that rank 2 has already freed (its Free is its own
// business, not a collective call). Rank 2 cannot read their blocks in
// place; every rank must learn of it at once, with an error naming a
// peer, not wait out the timeout (20 s) for an acknowledgement or a block
// that rank 2 will never give, and the next call must not hang either.
func TestSymmetricSourceFreedOnOneRank(t *testing.T) {
	const n = 64 << 10
	const limit = 5 * time.Second // a quarter of testranks' timeout
	inProcess(t, 3, func(c *collective.Communicator) error {
		ctx := context.Background()
		b, err := c.Alloc(ctx, n)
		if err != nil {
			return err
		}
		src := b.Bytes()
		if c.Rank() == 2 {
			if err := b.Free(); err != nil {
				return err
			}
			src = make([]byte, n) // large enough for the staging ring
		}
		for i, what := range []string{"the gather", "the next gather"} {
			start := time.Now()
			err := c.AllGather(ctx, make([]byte, 3*n), src)
			took := time.Since(start)
			var oe *collective.OpError
			if err == nil || !errors.As(err, &oe) || oe.Rank != c.Rank() || (i == 0 && (oe.Peer < 0 || oe.Peer == c.Rank())) {
				return fmt.Errorf("%s: %v, want an error naming this rank and a peer", what, err)
			}
			if took > limit {
				return fmt.Errorf("%s returned after %v (%v), want at once", what, took.Round(time.Millisecond), err)
			}
		}
		return nil
	})
}
