package intra

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/slimego/slimego/internal/fault"
)

// TestAllocSizesDiffer: an Alloc that one rank calls with another size
// fails on every rank of the node with ErrSizeMismatch, naming that rank
// and both sizes in the same words, and leaves the group usable: the next
// Alloc, of one size everywhere, works. A size the rank refuses itself
// (negative) is ErrInvalid there, and the same mismatch elsewhere: the
// call still counts, so that the next pairs with the next.
func TestAllocSizesDiffer(t *testing.T) {
	for _, tc := range []struct {
		odd, n int
		mine   string // what the odd rank's error says
	}{{0, 8192, "rank 0 asked for 8192 bytes"}, {1, 8192, "rank 1 asked for 8192 bytes"}, {2, 8192, "rank 2 asked for 8192 bytes"},
		{1, -1, "negative size -1"}} {
		t.Run(fmt.Sprintf("rank%d/%d", tc.odd, tc.n), func(t *testing.T) {
			theirs := fmt.Sprintf("rank %d asked for %d bytes", tc.odd, tc.n)
			errs := group(t, 3, Config{}, func(g *Group) error {
				ctx := context.Background()
				n, want, kind := 4096, theirs, fault.ErrSizeMismatch
				if g.rank == tc.odd {
					n, want = tc.n, tc.mine
					if tc.n < 0 {
						kind = fault.ErrInvalid
					}
				}
				b, err := g.Alloc(ctx, n)
				var oe *fault.OpError
				if !errors.Is(err, kind) || !errors.As(err, &oe) || !strings.Contains(oe.Detail, want) {
					return fmt.Errorf("Alloc(%d) with rank %d's size differing: buffer %t, %v; want %v saying %q", n, tc.odd, b != nil, err, kind, want)
				}
				b, err = g.Alloc(ctx, 4096)
				if err != nil {
					return fmt.Errorf("the next Alloc: %w", err)
				}
				if len(b.Bytes()) != 4096 {
					return fmt.Errorf("the next Alloc: %d bytes", len(b.Bytes()))
				}
				return b.Free()
			})
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
		})
	}
}
