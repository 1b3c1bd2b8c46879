package intra

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/internal/teststore"
	"github.com/slimego/slimego/rendezvous"
)

// TestGPUMismatchedPeerRunsAhead: after a size mismatch a rank of a GPU
// node whose kernel saw it (its status word set) goes on through its
// launches without waiting for its peers, and may run two launches ahead
// of a peer. Here, in a node of two ranks, rank 1 expects 1001 bytes from
// rank 0, which sends 1000: rank 1's kernel sees the size status, rank 0's
// nothing (its view of rank 1's block is rank 1's), as with the liar and
// its node peer in a GPU job across nodes. Rank 1 then runs three more
// launches (a Hier call across 4 nodes has as many node gathers left)
// before rank 0 runs its next one, which finds rank 1's flag of epoch 4 in
// the slot where it waits for epoch 2. Rank 0 must return ErrSizeMismatch
// naming rank 1 at once, not wait for the kernel's timeout.
func TestGPUMismatchedPeerRunsAhead(t *testing.T) {
	const timeout = 5 * time.Second
	ahead := make(chan struct{}) // rank 1 has run its launches
	// Rank 0's first call has returned: before that, rank 1's launches
	// ahead could lap the call itself, which then (rightly) fails too.
	first := make(chan struct{})
	errs := teststore.Run(t, 2, 60*time.Second, func(ctx context.Context, st *rendezvous.Client, r int) error {
		dev, err := device.OpenGPU(0)
		if err != nil {
			return err
		}
		g, err := NewGPU(ctx, GPUConfig{Store: st, Key: "lap", Rank: r, Size: 2, Dev: dev, Cap: 4096, Timeout: timeout})
		if err != nil {
			return err
		}
		defer g.Close(ctx)
		n, err := g.Node()
		if err != nil {
			return err
		}
		defer n.Close()
		b, err := dev.Alloc(4000)
		if err != nil {
			return err
		}
		defer b.Free()
		dst := DevSpan{Ptr: b.Ptr, N: 4000}
		sizes := []int{1000, 1000}
		if r == 1 {
			sizes[0] = 1001
		}
		op, err := n.Plan("allgather", dst, n.Slice(dst, r*2000, 1000), sizes, []int{0, 2000})
		if err != nil {
			return err
		}
		err = op.Run(ctx)
		if r == 0 {
			close(first)
			if err != nil {
				return fmt.Errorf("the mismatched call: %v, want no error (rank 1's block is the size rank 0 expects)", err)
			}
		}
		if r == 1 {
			defer close(ahead)
			if !errors.Is(err, fault.ErrSizeMismatch) {
				return fmt.Errorf("the mismatched call: %v, want ErrSizeMismatch", err)
			}
			select {
			case <-first:
			case <-ctx.Done():
				return ctx.Err()
			}
			for i := range 3 {
				if err := op.Run(ctx); !errors.Is(err, fault.ErrSizeMismatch) {
					return fmt.Errorf("launch %d after the mismatch: %v, want ErrSizeMismatch", i+2, err)
				}
			}
			return nil
		}
		select {
		case <-ahead:
		case <-ctx.Done():
			return ctx.Err()
		}
		start := time.Now()
		err = op.Run(ctx)
		var oe *fault.OpError
		if !errors.Is(err, fault.ErrSizeMismatch) || !errors.As(err, &oe) || oe.Peer != 1 {
			return fmt.Errorf("the launch behind rank 1 (after %v): %v, want ErrSizeMismatch naming rank 1", time.Since(start).Round(time.Millisecond), err)
		}
		if el := time.Since(start); el > timeout/2 {
			return fmt.Errorf("the launch behind rank 1 took %v (timeout %v)", el, timeout)
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}
