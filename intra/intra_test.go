package intra

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/internal/teststore"
	"github.com/slimego/slimego/rendezvous"
)

// group starts a store and L in-process ranks, and runs body on each.
func group(t *testing.T, L int, cfg Config, body func(g *Group) error) []error {
	t.Helper()
	prefix := fmt.Sprintf("slimego-test-%d-", os.Getpid())
	errs := teststore.Run(t, L, 60*time.Second, func(ctx context.Context, st *rendezvous.Client, r int) error {
		c := cfg
		c.Store, c.Key, c.ShmPrefix, c.Rank, c.Size = st, "t", prefix, r, L
		g, err := New(ctx, c)
		if err != nil {
			return err
		}
		defer g.Close()
		return body(g)
	})
	if left, _ := os.ReadDir("/dev/shm"); left != nil {
		for _, e := range left {
			if strings.HasPrefix(e.Name(), prefix) {
				t.Errorf("/dev/shm/%s left behind", e.Name())
			}
		}
	}
	return errs
}

func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

func expectAll(L int, sizes []int, iter int) ([]byte, []int) {
	offs := make([]int, L)
	total := 0
	for p := range L {
		offs[p] = total
		total += sizes[p]
	}
	want := make([]byte, total)
	for p := range L {
		fill(want[offs[p]:offs[p]+sizes[p]], uint64(p*1000003+iter))
	}
	return want, offs
}

// paths are the group configurations whose data paths the tests cover:
// inline, cross-memory attach and symmetric reads by default; the staging
// ring with CMA off, with small slots so that it wraps many times.
var paths = map[string]Config{
	"default": {Timeout: 20 * time.Second},
	"ring":    {Timeout: 20 * time.Second, CMAMin: -1, SlotBytes: 8 << 10, Slots: 2, ZeroCopyMin: 1 << 30},
}

func TestAllGatherInProcess(t *testing.T) {
	for name, cfg := range paths {
		for _, L := range []int{1, 2, 3, 5, 8} {
			for _, n := range []int{0, 1, 7, InlineBytes, InlineBytes + 1, 100_003, 1<<20 + 3} {
				if n > 1<<20 && L > 3 {
					continue // the multi-process tests cover large blocks with many ranks
				}
				for _, sym := range []bool{false, true} {
					testAllGather(t, name, cfg, L, n, sym)
				}
			}
		}
	}
}

func testAllGather(t *testing.T, name string, cfg Config, L, n int, sym bool) {
	t.Run(fmt.Sprintf("%s/L%d/n%d/sym%v", name, L, n, sym), func(t *testing.T) {
		sizes := make([]int, L)
		for p := range sizes {
			sizes[p] = n
		}
		errs := group(t, L, cfg, func(g *Group) error {
			ctx := context.Background()
			var src []byte
			if sym {
				b, err := g.Alloc(ctx, n)
				if err != nil {
					return err
				}
				src = b.Bytes()
			} else {
				src = make([]byte, n)
			}
			dst := make([]byte, L*n)
			_, offs := expectAll(L, sizes, 0)
			op, err := g.Plan("allgather", dst, src, sizes, offs)
			if err != nil {
				return err
			}
			for it := range 3 {
				fill(src, uint64(g.Rank()*1000003+it))
				if err := op.Run(ctx); err != nil {
					return err
				}
				want, _ := expectAll(L, sizes, it)
				if !bytes.Equal(dst, want) {
					return fmt.Errorf("iteration %d: wrong data", it)
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

func TestSizeMismatchEveryRank(t *testing.T) {
	const L = 4
	errs := group(t, L, Config{Timeout: 10 * time.Second}, func(g *Group) error {
		n := 100
		if g.Rank() == 2 {
			n = 101
		}
		sizes := []int{n, n, n, n}
		offs := []int{0, n, 2 * n, 3 * n}
		op, err := g.Plan("allgather", make([]byte, L*n), make([]byte, n), sizes, offs)
		if err != nil {
			return err
		}
		err = op.Run(context.Background())
		if !errors.Is(err, fault.ErrSizeMismatch) {
			return fmt.Errorf("want ErrSizeMismatch, got %v", err)
		}
		// The error names the peer whose header disagrees: rank 2 for the
		// others, and for rank 2, whom every peer disagrees with, the
		// first it checked, rank 0.
		want := 2
		if g.Rank() == 2 {
			want = 0
		}
		var oe *fault.OpError
		if !errors.As(err, &oe) || oe.Rank != g.Rank() || oe.Peer != want {
			return fmt.Errorf("want the error of rank %d to name peer %d: %v", g.Rank(), want, err)
		}
		if wantText := fmt.Sprintf("rank %d peer %d:", g.Rank(), want); !strings.Contains(err.Error(), wantText) {
			return fmt.Errorf("want %q in %q", wantText, err)
		}
		// The group stays usable after a mismatch.
		return g.Barrier(context.Background())
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

func TestPeerClosedIsPeerLost(t *testing.T) {
	errs := group(t, 3, Config{Timeout: 20 * time.Second}, func(g *Group) error {
		if g.Rank() == 1 {
			return nil // leaves (Close) without calling the barrier
		}
		start := time.Now()
		err := g.Barrier(context.Background())
		// With a 20 s timeout, only the loss can end the wait within 5 s.
		var oe *fault.OpError
		if !errors.Is(err, fault.ErrPeerLost) || !errors.As(err, &oe) || oe.Peer != 1 {
			return fmt.Errorf("want ErrPeerLost naming peer 1, got %v", err)
		}
		if time.Since(start) > 5*time.Second {
			return fmt.Errorf("took %v to notice", time.Since(start))
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// TestSixtyFourRanks: the largest local group the design promises, 32
// times more ranks than this machine has cores, every data path.
func TestSixtyFourRanks(t *testing.T) {
	const L = 64
	for _, n := range []int{0, 5, InlineBytes + 3, 40_000} {
		testAllGather(t, "default", paths["default"], L, n, n%2 == 1)
	}
	testAllGather(t, "ring", paths["ring"], L, 20_000, false)
}

// TestLeaveOwn: with LeaveOwn(true) a run leaves the rank's own block of
// dst as it was and fills every other, the other ranks still reading the
// block from src; LeaveOwn(false) copies it again.
func TestLeaveOwn(t *testing.T) {
	const L, n = 3, 100_003
	sizes := []int{n, n, n}
	errs := group(t, L, paths["default"], func(g *Group) error {
		ctx := context.Background()
		me := g.Rank()
		src, dst := make([]byte, n), make([]byte, L*n)
		want, offs := expectAll(L, sizes, 0)
		fill(src, uint64(me*1000003))
		op, err := g.Plan("allgather", dst, src, sizes, offs)
		if err != nil {
			return err
		}
		mark := make([]byte, n)
		fill(mark, 0xbad)
		for _, leave := range []bool{true, false} {
			copy(dst[offs[me]:], mark)
			op.LeaveOwn(leave)
			if err := op.Run(ctx); err != nil {
				return err
			}
			for p := range L {
				got, exp := dst[offs[p]:offs[p]+n], want[offs[p]:offs[p]+n]
				if p == me && leave {
					exp = mark
				}
				if !bytes.Equal(got, exp) {
					return fmt.Errorf("LeaveOwn(%v): rank %d's block wrong", leave, p)
				}
			}
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}
