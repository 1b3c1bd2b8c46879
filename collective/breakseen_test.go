package collective

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestBreakSeenByOthers: a rank whose call is cancelled while it waits
// for the others breaks the
// communicator on every rank, as the README says: its later calls return
// ErrClosed; every other rank's call that meets the break fails naming it
// (ErrPeerLost), and its calls after that return ErrClosed. One node of
// three ranks, three nodes of one (a ring), two nodes of two (hier, rank
// 1 waiting for the other node).
func TestBreakSeenByOthers(t *testing.T) {
	for _, shape := range [][2]int{{1, 3}, {3, 1}, {2, 2}} {
		t.Run(fmt.Sprintf("%dx%d", shape[0], shape[1]), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			// The late ranks: all but rank 1 on one node; across nodes,
			// the other node's.
			late := func(r int) bool { return shape[0] == 1 || r/shape[1] != 1/shape[1] }
			var waiting sync.WaitGroup // the late ranks, about to sleep
			for r := range shape[0] * shape[1] {
				if r != 1 && late(r) {
					waiting.Add(1)
				}
			}
			ready := make(chan struct{})
			go func() { waiting.Wait(); close(ready) }()
			errs := RunInProcess(ctx, shape[0], shape[1], func(o *Options) { o.Timeout = 10 * time.Second }, func(c *Communicator) error {
				src, dst := make([]byte, 64), make([]byte, 64*c.Size())
				if c.Rank() == 1 {
					select { // the late ranks sleep: its call waits for them
					case <-ready:
					case <-ctx.Done():
						return fmt.Errorf("the other ranks never came: %v", ctx.Err())
					}
					cctx, ccancel := context.WithCancel(ctx)
					time.AfterFunc(50*time.Millisecond, ccancel)
					if err := c.AllGather(cctx, dst, src); !errors.Is(err, context.Canceled) {
						return fmt.Errorf("the cancelled call: %v", err)
					}
					if err := c.AllGather(ctx, dst, src); !errors.Is(err, ErrClosed) {
						return fmt.Errorf("the call after it: %v, want ErrClosed", err)
					}
					return nil
				}
				// Rank 1 waits for this call, and is cancelled: across
				// nodes, waiting on the network for the other node's ranks.
				if late(c.Rank()) {
					waiting.Done()
					time.Sleep(500 * time.Millisecond)
				}
				var met error
				for i := 0; i < 3 && met == nil; i++ {
					met = c.AllGather(ctx, dst, src)
				}
				var oe *OpError
				if !errors.Is(met, ErrPeerLost) || !errors.As(met, &oe) || oe.Peer != 1 {
					return fmt.Errorf("the call that met the break: %v, want ErrPeerLost naming rank 1", met)
				}
				if err := c.AllGather(ctx, dst, src); !errors.Is(err, ErrClosed) {
					return fmt.Errorf("the call after it: %v, want ErrClosed", err)
				}
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
