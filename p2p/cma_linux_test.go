package p2p

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/slimego/slimego/inter"
)

// TestIovRange: the pieces vmCopy hands to its threads, cut at random
// lengths, together name each byte of the lists once, in order, here and
// in the peer alike.
func TestIovRange(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	local := make([]byte, 1<<20)
	for trial := range 200 {
		var liov []unix.Iovec
		var riov []unix.RemoteIovec
		n := 0
		for range 1 + rng.IntN(8) {
			m := 1 + rng.IntN(4096)
			if trial%4 == 0 {
				m = 1 // ranges of one byte: pieces end at every edge
			}
			at := rng.IntN(len(local) - m)
			v := unix.Iovec{Base: &local[at]}
			v.SetLen(m)
			liov = append(liov, v)
			riov = append(riov, unix.RemoteIovec{Base: uintptr(1<<40 + at*3), Len: m})
			n += m
		}
		for k := 1; k <= min(n, 5); k++ {
			t.Run(fmt.Sprintf("%d/%d", trial, k), func(t *testing.T) {
				var lw, rw []uintptr // every byte's address, in order
				for i := range riov {
					for j := range riov[i].Len {
						lw = append(lw, uintptr(unsafe.Pointer(liov[i].Base))+uintptr(j))
						rw = append(rw, riov[i].Base+uintptr(j))
					}
				}
				var lg, rg []uintptr
				for s := range k {
					lo, hi := inter.Stripe(n, k, s)
					pl, pr := iovRange(liov, riov, lo, hi)
					if len(pl) != len(pr) {
						t.Fatalf("piece %d: %d local ranges, %d remote", s, len(pl), len(pr))
					}
					m := 0
					for i := range pr {
						if int(pl[i].Len) != pr[i].Len || pr[i].Len == 0 {
							t.Fatalf("piece %d, range %d: %d bytes here, %d in the peer", s, i, pl[i].Len, pr[i].Len)
						}
						for j := range pr[i].Len {
							lg = append(lg, uintptr(unsafe.Pointer(pl[i].Base))+uintptr(j))
							rg = append(rg, pr[i].Base+uintptr(j))
						}
						m += pr[i].Len
					}
					if m != hi-lo {
						t.Fatalf("piece %d: %d bytes, want %d", s, m, hi-lo)
					}
				}
				if !slices.Equal(lg, lw) || !slices.Equal(rg, rw) {
					t.Fatal("the pieces do not name the lists' bytes in order")
				}
			})
		}
	}
}
