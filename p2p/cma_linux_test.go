package p2p

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync/atomic"
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

// TestVMCopyPieces: vmCopy of 8 MiB in 37 ranges, within this process,
// with four processors: the copy is cut among four threads, every byte
// is in place when vmCopy returns (no piece still copying), and the
// threads are given back. A range of the peer that is not mapped fails
// the copy, in the first piece or the last, and leaves the part's lock
// free and no thread counted.
func TestVMCopyPieces(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	var most atomic.Int32
	testHookVMPieces = func(k int) {
		if int32(k) > most.Load() {
			most.Store(int32(k))
		}
	}
	defer func() { testHookVMPieces = nil }()
	const n = 8 << 20
	rng := rand.New(rand.NewPCG(5, 6))
	src := make([]byte, n)
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	// Cut [0, n) into ranges; range j of the peer's bytes lands at the
	// place of range len-1-j here, so that a piece copied to the wrong
	// place shows.
	var cuts []int
	for at := 0; at < n; {
		m := min(n-at, 1+rng.IntN(n/18))
		cuts = append(cuts, m)
		at += m
	}
	for _, write := range []bool{false, true} {
		dst := make([]byte, n)
		here, there := dst, src // read: from src (the peer) into dst
		if write {
			here, there = src, dst
		}
		var liov []unix.Iovec
		var riov []unix.RemoteIovec
		want := make([]byte, n)
		rAt, lEnd := 0, n
		for _, m := range cuts {
			lAt := lEnd - m
			v := unix.Iovec{Base: &here[lAt]}
			v.SetLen(m)
			liov = append(liov, v)
			riov = append(riov, unix.RemoteIovec{Base: uintptr(unsafe.Pointer(&there[rAt])), Len: m})
			if write {
				copy(want[rAt:rAt+m], here[lAt:lAt+m])
			} else {
				copy(want[lAt:lAt+m], there[rAt:rAt+m])
			}
			rAt, lEnd = rAt+m, lAt
		}
		p := &part{active: true}
		most.Store(0)
		if err := vmCopy(p, unix.Getpid(), liov, riov, n, write); err != nil {
			t.Fatalf("write %v: %v", write, err)
		}
		if !bytes.Equal(dst, want) {
			t.Fatalf("write %v: the bytes are not all in place when vmCopy returns", write)
		}
		if most.Load() != 4 {
			t.Errorf("write %v: copied with at most %d threads, want 4", write, most.Load())
		}
		if v := vmThreads.Load(); v != 0 {
			t.Errorf("write %v: %d threads still counted", write, v)
		}
	}
	// A hole in the peer's memory: a mapping that cannot be read (kept
	// mapped, so that no allocation takes its place meanwhile).
	hole, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(hole)
	holeAt := uintptr(unsafe.Pointer(&hole[0]))
	for _, first := range []bool{true, false} {
		dst := make([]byte, n)
		r := []unix.RemoteIovec{{Base: uintptr(unsafe.Pointer(&src[0])), Len: n - 1<<20}, {Base: holeAt, Len: 1 << 20}}
		if first {
			r[0], r[1] = r[1], r[0]
		}
		l := make([]unix.Iovec, 2) // pieces as long as the peer's, range by range
		l[0].Base, l[1].Base = &dst[0], &dst[r[0].Len]
		l[0].SetLen(r[0].Len)
		l[1].SetLen(r[1].Len)
		p := &part{active: true}
		if err := vmCopy(p, unix.Getpid(), l, r, n, false); err == nil {
			t.Errorf("hole first %v: a copy from unmapped memory succeeded", first)
		}
		if !p.mu.TryLock() {
			t.Errorf("hole first %v: the part's lock is held after the copy", first)
		}
		if v := vmThreads.Load(); v != 0 {
			t.Errorf("hole first %v: %d threads still counted", first, v)
		}
	}
}
