package collective

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestAllocAgainstAllGatherAcrossNodes: across two nodes, one rank calls
// Alloc where the others call AllGather. Every rank's call must fail
// with ErrSizeMismatch naming both calls, as on one node; the other
// node's ranks once paired their AllGather with that rank's next call
// and returned its block with no error.
func TestAllocAgainstAllGatherAcrossNodes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := RunInProcess(ctx, 2, 2, func(o *Options) { o.Timeout = 4 * time.Second }, func(c *Communicator) error {
		dst := make([]byte, c.Size())
		if c.Rank() == 1 {
			actx, acancel := context.WithTimeout(ctx, time.Second)
			_, aerr := c.Alloc(actx, 4096)
			acancel()
			t.Logf("rank 1's alloc: %v", aerr)
			if !errors.Is(aerr, ErrSizeMismatch) {
				return fmt.Errorf("alloc against the others' allgather: %v, want ErrSizeMismatch", aerr)
			}
			c.AllGather(ctx, dst, []byte{21}) // no peer makes it: it may fail
			return nil
		}
		err := c.AllGather(ctx, dst, []byte{byte(10 + c.Rank())})
		t.Logf("rank %d's allgather: %v", c.Rank(), err)
		if !errors.Is(err, ErrSizeMismatch) {
			return fmt.Errorf("allgather against rank 1's alloc: %v %v, want ErrSizeMismatch", err, dst)
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}
