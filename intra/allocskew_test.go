package intra

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"
)

// TestAllocFailedOnOneRank: rank 1 gives up on an Alloc (its context's
// deadline passes while rank 0 still creates a large segment) that rank 0
// completes. The ranks' later buffers must still be the same buffers to
// both: a gather from a symmetric buffer allocated after it moves the
// right bytes (or fails), never another buffer's bytes without an error;
// and the segment rank 0 made is unlinked (group checks /dev/shm).
func TestAllocFailedOnOneRank(t *testing.T) {
	const big, n = 1 << 30, 4096
	var gaveUp, made [2]bool
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
			gaveUp[g.Rank()] = true
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
	if !made[0] || !gaveUp[1] {
		t.Skipf("could not provoke the skew: rank 0 made the buffer %v, rank 1 gave up %v", made[0], gaveUp[1])
	}
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}
