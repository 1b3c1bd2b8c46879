package intra

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/fault"
)

// announce is step 1 of Op.run alone: o's rank publishes its header for the
// next call and then does nothing more, as a peer that is alive but stuck
// would. It returns the call's epoch.
func announce(o *Op) uint64 {
	g := o.g
	e := g.epoch + 1
	g.epoch = e
	h := g.hdrs[g.rank][int(e&1)]
	h.size, h.hash, h.mode, h.zcBuf, h.zcOff = uint64(o.sizes[g.rank]), o.hash, o.mode, o.zcBuf, o.zcOff
	if o.mode == modeStaged && o.sizes[g.rank] <= InlineBytes {
		copy(h.inline[:], o.src)
	}
	atomic.StoreUint64(&h.epoch, e)
	g.ringAll()
	return e
}

// ringCfg sends every block above InlineBytes through the staging ring.
func ringCfg(timeout time.Duration) Config {
	return Config{Timeout: timeout, CMAMin: -1, ZeroCopyMin: 1 << 30, SlotBytes: 8 << 10, Slots: 2}
}

// TestSilentPeerTimesOut: at every wait of a call (for the peer's header,
// for a chunk of its block, for a free slot of this rank's ring, for the
// acknowledgement of a zero-copy read) a peer that is alive but does
// nothing more makes the call return ErrTimeout after Config.Timeout,
// naming the peer and what was awaited. The silent peer stays alive for
// 3 s at most, so that a wait that ignores its deadline fails the test
// (with ErrPeerLost when the peer leaves) instead of hanging it.
func TestSilentPeerTimesOut(t *testing.T) {
	const timeout = 300 * time.Millisecond
	sym := Config{Timeout: timeout, ZeroCopyMin: 1, CMAMin: -1}
	cases := []struct {
		name  string
		cfg   Config
		sizes []int
		sym   bool // rank 0's source is a symmetric buffer
		quiet bool // the peer does not even announce
		what  string
	}{
		{"header", Config{Timeout: timeout}, []int{100, 100}, false, true, "the header"},
		{"chunk", ringCfg(timeout), []int{100_000, 100_000}, false, false, "a chunk"},
		{"free slot", ringCfg(timeout), []int{200_000, 0}, false, false, "a free ring slot"},
		{"ack", sym, []int{100, 100}, true, false, "the acknowledgement of a zero-copy read"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			done := make(chan struct{})
			offs := []int{0, c.sizes[0]}
			total := c.sizes[0] + c.sizes[1]
			errs := group(t, 2, c.cfg, func(g *Group) error {
				ctx := context.Background()
				me := g.Rank()
				src := make([]byte, c.sizes[me])
				if c.sym {
					b, err := g.Alloc(ctx, c.sizes[me])
					if err != nil {
						return err
					}
					src = b.Bytes()
				}
				op, err := g.Plan("allgather", make([]byte, total), src, c.sizes, offs)
				if err != nil {
					return err
				}
				if me == 1 {
					if !c.quiet {
						announce(op)
					}
					select {
					case <-done:
					case <-time.After(3 * time.Second):
					}
					return nil
				}
				defer close(done)
				start := time.Now()
				err = op.Run(ctx)
				took := time.Since(start)
				var oe *fault.OpError
				if !errors.Is(err, fault.ErrTimeout) || !errors.As(err, &oe) || oe.Peer != 1 {
					return fmt.Errorf("after %v: want ErrTimeout naming peer 1, got %v", took, err)
				}
				if !strings.Contains(err.Error(), "waited 300ms for "+c.what) {
					return fmt.Errorf("want a wait for %s: %v", c.what, err)
				}
				if took > 5*time.Second {
					return fmt.Errorf("a 300 ms timeout took %v", took)
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

// TestInPlaceEveryRank: an all-gather whose source is the rank's own block
// of its destination, on every rank and not only rank 0, with blocks of
// different sizes, on every data path: inline, staging ring, cross-memory
// attach, and a symmetric destination read in place.
func TestInPlaceEveryRank(t *testing.T) {
	const L = 3
	cfgs := map[string]Config{
		"default":   {Timeout: 20 * time.Second},
		"ring":      ringCfg(20 * time.Second),
		"symmetric": {Timeout: 20 * time.Second, ZeroCopyMin: 1, CMAMin: -1},
	}
	for name, cfg := range cfgs {
		for _, n := range []int{7, 40_000, 300_001} {
			t.Run(fmt.Sprintf("%s/n%d", name, n), func(t *testing.T) {
				sizes := []int{n, n + 64, n + 3}
				errs := group(t, L, cfg, func(g *Group) error {
					ctx := context.Background()
					me := g.Rank()
					want, offs := expectAll(L, sizes, 0)
					var dst []byte
					if name == "symmetric" {
						b, err := g.Alloc(ctx, len(want))
						if err != nil {
							return err
						}
						dst = b.Bytes()
					} else {
						dst = make([]byte, len(want))
					}
					for it := range 2 {
						want, _ = expectAll(L, sizes, it)
						fill(dst, uint64(0xdead+me+it)) // stale bytes
						src := dst[offs[me] : offs[me]+sizes[me]]
						copy(src, want[offs[me]:])
						op, err := g.Plan("allgather", dst, src, sizes, offs)
						if err != nil {
							return err
						}
						if !op.inPlace {
							return fmt.Errorf("Plan did not see the call as in place")
						}
						if err := op.Run(ctx); err != nil {
							return err
						}
						for p := range L {
							if !bytes.Equal(dst[offs[p]:offs[p]+sizes[p]], want[offs[p]:offs[p]+sizes[p]]) {
								return fmt.Errorf("call %d: block of rank %d wrong", it, p)
							}
						}
						if err := g.Barrier(ctx); err != nil {
							return err
						}
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
}

// TestRingNeverOverwritesUnread: rank 1 reads rank 0's ring by hand, one
// chunk at a time, and lets rank 0 run ahead as far as it will (until it
// sleeps or has published everything) before each read. At every step each
// of rank 0's slots must hold a chunk not yet read that is at most
// Slots−1 chunks ahead of the next one to read, with that chunk's bytes, and
// the next chunk must be there: a writer that reuses a slot one chunk early
// overwrites a chunk the reader has not read, and this test sees it in the
// data at once instead of in a timeout.
func TestRingNeverOverwritesUnread(t *testing.T) {
	for _, K := range []int{2, 3} {
		t.Run(fmt.Sprintf("slots%d", K), func(t *testing.T) {
			cfg := Config{Timeout: 10 * time.Second, CMAMin: -1, ZeroCopyMin: 1 << 30, SlotBytes: 1024, Slots: K}
			const n = 40_000 // 40 chunks of 1 KiB
			sizes, offs := []int{n, 0}, []int{0, n}
			src := make([]byte, n)
			fill(src, 42)
			writerDone := make(chan error, 1)
			errs := group(t, 2, cfg, func(g *Group) error {
				ctx := context.Background()
				var s []byte
				if g.Rank() == 0 {
					s = src
				}
				op, err := g.Plan("allgather", make([]byte, n), s, sizes, offs)
				if err != nil {
					return err
				}
				if g.Rank() == 0 {
					err := op.Run(ctx)
					writerDone <- err
					return err
				}
				chunk, count := chunking(n, g.lay.C)
				if count < 4*K {
					return fmt.Errorf("only %d chunks", count)
				}
				announce(op)
				finished := false
				for next := 0; next < count; next++ {
					// Let the writer go as far as it can: until chunk next is
					// there and the writer sleeps (it stores sleeping = 0
					// before it publishes after a sleep), or it has finished.
					deadline := time.Now().Add(5 * time.Second)
					for !finished {
						s := atomic.LoadUint64(g.stamps[0][next%K])
						if s > uint64(next+1) {
							return fmt.Errorf("chunk %d overwritten by chunk %d before it was read (%d slots)", next, s-1, K)
						}
						if s == uint64(next+1) && atomic.LoadUint32(&g.ctrls[0].sleeping) != 0 {
							break
						}
						select {
						case err := <-writerDone:
							if err != nil {
								return fmt.Errorf("writer: %v", err)
							}
							finished = true
						default:
						}
						if time.Now().After(deadline) {
							return fmt.Errorf("chunk %d: the writer neither sleeps nor finishes", next)
						}
					}
					for k := range K {
						s := atomic.LoadUint64(g.stamps[0][k])
						if s == 0 {
							continue // never written
						}
						c := int(s - 1)
						if c < next {
							continue // a chunk already read
						}
						if c >= next+K || c%K != k {
							return fmt.Errorf("before chunk %d was read, slot %d holds chunk %d (%d slots)", next, k, c, K)
						}
						lo, hi := c*chunk, min((c+1)*chunk, n)
						if !bytes.Equal(g.slots[0][k][:hi-lo], src[lo:hi]) {
							return fmt.Errorf("slot %d: chunk %d's bytes are wrong before chunk %d was read", k, c, next)
						}
					}
					k := next % K
					if s := atomic.LoadUint64(g.stamps[0][k]); s != uint64(next+1) {
						return fmt.Errorf("slot %d holds chunk %d where chunk %d is due", k, int(s)-1, next)
					}
					atomic.StoreUint64(&g.myAcks[0].consumed, uint64(next+1))
					g.ring(0)
				}
				if !finished {
					select {
					case err := <-writerDone:
						if err != nil {
							return fmt.Errorf("writer: %v", err)
						}
					case <-time.After(10 * time.Second):
						return fmt.Errorf("the writer did not finish after every chunk was read")
					}
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
