package rendezvous

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// BenchmarkBarrierMembers: one barrier of P members, each on its own
// connection to a store of this process; ns/op is one barrier.
func BenchmarkBarrierMembers(b *testing.B) {
	for _, P := range []int{8, 128, 1024} {
		b.Run(fmt.Sprintf("P=%d", P), func(b *testing.B) {
			srv, err := Listen("127.0.0.1:0", ServerConfig{})
			if err != nil {
				b.Fatal(err)
			}
			defer srv.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			cs := make([]*Client, P)
			for i := range cs {
				if cs[i], err = Dial(ctx, srv.Addr().String(), Auth{}); err != nil {
					b.Fatal(err)
				}
				defer cs[i].Close()
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				var wg sync.WaitGroup
				name := fmt.Sprintf("slimego/run-0123456789abcdef/world/layout-read-%d", i)
				for r := range P {
					wg.Go(func() {
						if err := cs[r].Barrier(ctx, name, r, P); err != nil {
							b.Error(err)
						}
					})
				}
				wg.Wait()
			}
		})
	}
}
