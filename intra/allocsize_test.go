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
// Alloc, of one size everywhere, works.
func TestAllocSizesDiffer(t *testing.T) {
	for _, odd := range []int{0, 1, 2} {
		t.Run(fmt.Sprintf("rank%d", odd), func(t *testing.T) {
			want := fmt.Sprintf("rank %d asked for 8192 bytes", odd)
			errs := group(t, 3, Config{}, func(g *Group) error {
				ctx := context.Background()
				n := 4096
				if g.rank == odd {
					n = 8192
				}
				b, err := g.Alloc(ctx, n)
				var oe *fault.OpError
				if !errors.Is(err, fault.ErrSizeMismatch) || !errors.As(err, &oe) || !strings.Contains(oe.Detail, want) {
					return fmt.Errorf("Alloc(%d) with rank %d's size differing: buffer %t, %v; want ErrSizeMismatch saying %q", n, odd, b != nil, err, want)
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
