package intra

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/slimego/slimego/rendezvous"
)

// BenchmarkAllGather runs two in-process ranks; rank 0 times the runs.
func BenchmarkAllGather(b *testing.B) {
	for _, n := range []int{8, 4096, 32 << 10, 256 << 10, 4 << 20} {
		for _, sym := range []bool{false, true} {
			b.Run(fmt.Sprintf("n=%d/sym=%v", n, sym), func(b *testing.B) {
				benchGroup(b, 2, n, sym)
			})
		}
	}
}

func benchGroup(b *testing.B, L, n int, sym bool) {
	srv, err := rendezvous.Listen("127.0.0.1:0", rendezvous.ServerConfig{})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	iters := b.N
	var wg sync.WaitGroup
	ready := make(chan struct{})
	for r := range L {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := rendezvous.Dial(ctx, srv.Addr().String(), rendezvous.Auth{})
			if err != nil {
				b.Error(err)
				return
			}
			defer st.Close()
			g, err := New(ctx, Config{Store: st, Key: "b", ShmPrefix: "slimego-bench-", Rank: r, Size: L})
			if err != nil {
				b.Error(err)
				return
			}
			defer g.Close()
			src := make([]byte, n)
			if sym {
				buf, err := g.Alloc(ctx, n)
				if err != nil {
					b.Error(err)
					return
				}
				src = buf.Bytes()
			}
			sizes, offs := make([]int, L), make([]int, L)
			for p := range L {
				sizes[p], offs[p] = n, p*n
			}
			op, err := g.Plan("allgather", make([]byte, L*n), src, sizes, offs)
			if err != nil {
				b.Error(err)
				return
			}
			for range 10 {
				op.Run(ctx)
			}
			if r == 0 {
				b.SetBytes(int64(L * n))
				b.ReportAllocs()
				b.ResetTimer()
				close(ready)
			} else {
				<-ready
			}
			for range iters {
				if err := op.Run(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}
