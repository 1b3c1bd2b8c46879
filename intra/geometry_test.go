package intra

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/internal/teststore"
	"github.com/slimego/slimego/rendezvous"
)

// TestNewHugeGeometry: slot sizes and counts whose segment does not fit
// in an int (SLIME_SLOT_BYTES and SLIME_SLOTS take up to 2^62) are
// refused with ErrInvalid, not wrapped round to a small segment that
// every offset runs past (a panic in bind); so is a ring of one slot,
// and the error names the operation and the rank.
func TestNewHugeGeometry(t *testing.T) {
	errs := teststore.Run(t, 1, 20*time.Second, func(ctx context.Context, st *rendezvous.Client, _ int) error {
		for i, c := range []struct{ slots, slotBytes int }{
			{4, 1<<62 - lineBytes}, // 4 × 2^62: 0 bytes once wrapped
			{1 << 62, lineBytes},
			{1 << 30, 1 << 40},
			{1, DefaultSlotBytes},
		} {
			short, cancel := context.WithTimeout(ctx, 2*time.Second)
			var g *Group
			var err error
			func() {
				defer func() {
					if p := recover(); p != nil {
						err = fmt.Errorf("panic: %v", p)
					}
				}()
				g, err = New(short, Config{Store: st, Key: fmt.Sprintf("huge%d", i), ShmPrefix: fmt.Sprintf("slimego-test-%d-", os.Getpid()),
					Rank: 0, Size: 1, Slots: c.slots, SlotBytes: c.slotBytes})
			}()
			cancel()
			if g != nil {
				g.Close()
			}
			var oe *fault.OpError
			if !errors.Is(err, fault.ErrInvalid) || !errors.As(err, &oe) || oe.Op != "init" || oe.Rank != 0 {
				return fmt.Errorf("%d slots of %d bytes: want ErrInvalid, got %v", c.slots, c.slotBytes, err)
			}
		}
		return nil
	})
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
}
