package collective

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestLateRankReadsNoStaleBlock: on one node, the owners of blocks read
// in place (process_vm_readv from a plain source, or a symmetric buffer)
// time out waiting for a late rank and return, their sources then
// overwritten. The late rank must not take their headers, still there,
// for a live call and copy what their memory holds now: its call fails,
// or it returns the blocks the owners passed.
func TestLateRankReadsNoStaleBlock(t *testing.T) {
	for _, symmetric := range []bool{false, true} {
		t.Run(map[bool]string{false: "cma", true: "symmetric"}[symmetric], func(t *testing.T) {
			const n = 100 << 10
			const timeout = time.Second
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			counts := []int{n, n, 0}
			errs := RunInProcess(ctx, 1, 3, func(o *Options) { o.Timeout = timeout }, func(c *Communicator) error {
				var src []byte
				if symmetric {
					buf, err := c.Alloc(ctx, n)
					if err != nil {
						return err
					}
					src = buf.Bytes()[:counts[c.Rank()]]
				} else {
					src = make([]byte, counts[c.Rank()])
				}
				for i := range src {
					src[i] = byte(c.Rank() + 1)
				}
				dst := make([]byte, 2*n)
				if c.Rank() == 2 {
					time.Sleep(timeout + 500*time.Millisecond)
					err := c.AllGatherV(ctx, dst, src, counts)
					t.Logf("the late rank: %v", err)
					if err == nil && (!bytes.Equal(dst[:n], bytes.Repeat([]byte{1}, n)) || !bytes.Equal(dst[n:], bytes.Repeat([]byte{2}, n))) {
						return fmt.Errorf("late rank: success with wrong blocks (dst[0] %#x, dst[n] %#x; want 0x1, 0x2)", dst[0], dst[n])
					}
					return nil
				}
				if err := c.AllGatherV(ctx, dst, src, counts); err == nil {
					return errors.New("an owner's call succeeded without the late rank")
				}
				for i := range src { // the owner's call has returned: its source is its own
					src[i] = 0xee
				}
				time.Sleep(timeout + time.Second) // its memory stays, overwritten
				return nil
			})
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
		})
	}
}
