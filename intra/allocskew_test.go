package intra

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/fault"
)

// TestAllocFailedOnOneRank: rank 1 gives up on an Alloc (its context's
// deadline passes while rank 0 still creates a large segment). Rank 0's
// Alloc must fail too, naming rank 1 (all or none), and the ranks' later
// buffers must still be the same buffers to both: a gather from a
// symmetric buffer allocated after it moves the right bytes (or fails),
// never another buffer's bytes without an error; and the segment rank 0
// made is unlinked (group checks /dev/shm).
func TestAllocFailedOnOneRank(t *testing.T) {
	const big, n = 1 << 30, 4096
	var gaveUp, made [2]bool
	var bigErr [2]error
	errs := group(t, 2, Config{Timeout: 30 * time.Second}, func(g *Group) error {
		ctx := context.Background()
		actx := ctx
		if g.Rank() == 1 {
			var cancel context.CancelFunc
			actx, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
		}
		if b, err := g.Alloc(actx, big); err == nil {
			made[g.Rank()] = true
			defer b.Free()
		} else {
			gaveUp[g.Rank()], bigErr[g.Rank()] = true, err
		}
		var bufs [2]*Buffer
		for i := range bufs {
			b, err := g.Alloc(ctx, n)
			if err != nil {
				return err
			}
			defer b.Free()
			bufs[i] = b
		}
		fill(bufs[0].Bytes(), uint64(g.Rank()+1))
		fill(bufs[1].Bytes(), uint64(g.Rank()+100))
		dst := make([]byte, 2*n)
		op, err := g.Plan("allgather", dst, bufs[0].Bytes(), []int{n, n}, []int{0, n})
		if err != nil {
			return err
		}
		if err := op.Run(ctx); err != nil {
			return nil // an error is a fair answer; wrong data is not
		}
		want := make([]byte, 2*n)
		fill(want[:n], 1)
		fill(want[n:], 2)
		if !bytes.Equal(dst, want) {
			return fmt.Errorf("the gather from the buffer allocated after the skewed Alloc returned nil with other bytes than the peers' (ids %d, %d)", bufs[0].id, bufs[1].id)
		}
		return nil
	})
	if !gaveUp[1] {
		t.Skip("could not provoke the skew: rank 1 did not give up")
	}
	var oe *fault.OpError
	if made[0] {
		t.Errorf("rank 0: the Alloc that rank 1 gave up on returned a buffer")
	} else if !errors.Is(bigErr[0], fault.ErrPeerLost) || !errors.As(bigErr[0], &oe) || oe.Peer != 1 {
		t.Errorf("rank 0: the Alloc that rank 1 gave up on: %v, want ErrPeerLost naming rank 1", bigErr[0])
	}
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// TestAllocGivenUpBeforeRankZeroCame: rank 1 gives up on an Alloc before
// rank 0 has even asked (rank 0 comes late): rank 1 never reads the
// segment's name, rank 0 makes the segment all the same, and both must
// fail (rank 0 naming rank 1), leave nothing in /dev/shm (group checks)
// and allocate together afterwards.
func TestAllocGivenUpBeforeRankZeroCame(t *testing.T) {
	errs := group(t, 2, Config{Timeout: 20 * time.Second}, func(g *Group) error {
		ctx := context.Background()
		var err error
		if g.Rank() == 1 {
			short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			_, err = g.Alloc(short, 4096)
			cancel()
		} else {
			time.Sleep(600 * time.Millisecond)
			_, err = g.Alloc(ctx, 4096)
		}
		var oe *fault.OpError
		if !errors.As(err, &oe) || oe.Peer != 1-g.Rank() {
			return fmt.Errorf("the Alloc rank 1 gave up on: %v, want an error naming rank %d", err, 1-g.Rank())
		}
		b, err := g.Alloc(ctx, 4096)
		if err != nil {
			return fmt.Errorf("the Alloc after: %w", err)
		}
		return b.Free()
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}
