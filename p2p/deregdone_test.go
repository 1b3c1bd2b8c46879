package p2p

import (
	"context"
	"testing"
)

// TestDeregisterIdleWithDoneContext: a region that nothing uses is
// deregistered even when the context is already done. Both the drained
// channel and ctx.Done are ready then; the region's state, not a random
// pick between them, decides.
func TestDeregisterIdleWithDoneContext(t *testing.T) {
	for _, name := range []string{"tcp", "same host"} {
		t.Run(name, func(t *testing.T) {
			a, _, _, _ := pair(t, func(o *Options) { o.TCPOnly = name == "tcp" })
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			for i := range 100 {
				r, err := a.Register("idle", make([]byte, 64))
				if err != nil {
					t.Fatal(err)
				}
				if err := a.Deregister(ctx, r); err != nil {
					t.Fatalf("deregister %d of an idle region with a done context: %v", i, err)
				}
			}
		})
	}
}
