package p2p

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// BenchmarkRead and BenchmarkWrite move one region's bytes between two
// endpoints of this process over loopback TCP and over the same-host
// transport (slimebench p2p measures between processes).
func BenchmarkRead(b *testing.B)  { benchOneSided(b, false) }
func BenchmarkWrite(b *testing.B) { benchOneSided(b, true) }

func benchOneSided(b *testing.B, write bool) {
	for _, tcpOnly := range []bool{true, false} {
		for _, size := range []int{8, 64 << 10, 4 << 20, 64 << 20} {
			name := map[bool]string{true: "tcp", false: "cma"}[tcpOnly]
			b.Run(fmt.Sprintf("%s/%d", name, size), func(b *testing.B) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				defer cancel()
				mk := func(n string) *Endpoint {
					e, err := New(ctx, Options{Name: n, TCPOnly: tcpOnly})
					if err != nil {
						b.Fatal(err)
					}
					return e
				}
				a, c := mk("a"), mk("b")
				defer a.Close()
				defer c.Close()
				p, err := a.ConnectInfo(ctx, c.Info())
				if err != nil {
					b.Fatal(err)
				}
				lr, _ := a.Register("l", make([]byte, size))
				rr, _ := c.Register("r", make([]byte, size))
				ops := []Op{{Local: lr, Remote: rr.Remote(), Len: size}}
				b.SetBytes(int64(size))
				b.ResetTimer()
				for range b.N {
					f := p.Read(ops)
					if write {
						f = p.Write(ops)
					}
					if err := f.Wait(ctx); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
