package collective_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/internal/pattern"
	"github.com/slimego/slimego/internal/testranks"
)

// inProcess runs body on P ranks that live in this process, one goroutine
// each, sharing a store: the same API and shared-memory path as separate
// processes.
func inProcess(t *testing.T, P int, body func(c *collective.Communicator) error) {
	t.Helper()
	inProcessNodes(t, 1, P, nil, body)
}

func inProcessNodes(t *testing.T, nodes, perNode int, tune func(*collective.Options), body func(c *collective.Communicator) error) {
	t.Helper()
	testranks.Run(t, nodes, perNode, tune, body)
}

func TestInProcessAllGather(t *testing.T) {
	for _, P := range []int{1, 2, 3, 6} {
		t.Run(fmt.Sprintf("P=%d", P), func(t *testing.T) {
			inProcess(t, P, func(c *collective.Communicator) error {
				ctx := context.Background()
				me := c.Rank()
				if c.Size() != P || c.LocalSize() != P || c.Nodes() != 1 || c.NodeRank() != 0 || c.LocalRank() != me {
					return fmt.Errorf("topology: rank %d size %d local %d/%d node %d/%d", me, c.Size(), c.LocalRank(), c.LocalSize(), c.NodeRank(), c.Nodes())
				}
				for _, n := range []int{0, 1, 13, 300, 70_001} {
					src, dst := make([]byte, n), make([]byte, P*n)
					for it := range 3 {
						pattern.Fill(src, pattern.Seed(me, it, 0))
						if err := c.AllGather(ctx, dst, src); err != nil {
							return err
						}
						for r := range P {
							if i := pattern.Check(dst[r*n:r*n+n], pattern.Seed(r, it, 0)); i >= 0 {
								return fmt.Errorf("%d bytes: rank %d's block wrong at %d", n, r, i)
							}
						}
					}
				}
				// Typed, uneven.
				counts := make([]int, P)
				total := 0
				for r := range counts {
					counts[r] = 3*r + 1
					total += counts[r]
				}
				src := make([]float64, counts[me])
				for i := range src {
					src[i] = float64(me)*1000 + float64(i) + 0.25
				}
				dst := make([]float64, total)
				if err := collective.AllGatherVOf(ctx, c, dst, src, counts); err != nil {
					return err
				}
				k := 0
				for r := range P {
					for i := range counts[r] {
						if want := float64(r)*1000 + float64(i) + 0.25; dst[k] != want {
							return fmt.Errorf("allgatherv element %d = %v, want %v", k, dst[k], want)
						}
						k++
					}
				}
				return c.Barrier(ctx)
			})
		})
	}
}

func TestPlanRunAllocatesNothing(t *testing.T) {
	const P, n = 2, 4096
	inProcess(t, P, func(c *collective.Communicator) error {
		ctx := context.Background()
		sym, err := c.Alloc(ctx, n)
		if err != nil {
			return err
		}
		for _, src := range [][]byte{make([]byte, n), sym.Bytes()} {
			plan, err := c.Plan(make([]byte, P*n), src)
			if err != nil {
				return err
			}
			allocs, err := testranks.AllocsPerRun(c, func() error { return plan.Run(ctx) })
			if err != nil {
				return err
			}
			if allocs != 0 {
				return fmt.Errorf("Plan.Run allocated %v times per run", allocs)
			}
		}
		// The one-shot call re-plans in place: no allocation either.
		dst, src := make([]byte, P*n), make([]byte, n)
		allocs, err := testranks.AllocsPerRun(c, func() error { return c.AllGather(ctx, dst, src) })
		if err != nil {
			return err
		}
		if allocs != 0 {
			return fmt.Errorf("AllGather allocated %v times per call", allocs)
		}
		return c.Barrier(ctx)
	})
}

func TestClosedCommunicator(t *testing.T) {
	inProcess(t, 1, func(c *collective.Communicator) error {
		c.Close()
		err := c.AllGather(context.Background(), make([]byte, 8), make([]byte, 8))
		if !errors.Is(err, collective.ErrClosed) {
			return fmt.Errorf("AllGather after Close: %v", err)
		}
		return nil
	})
}

func TestContextCancel(t *testing.T) {
	inProcess(t, 2, func(c *collective.Communicator) error {
		if c.Rank() == 1 {
			time.Sleep(300 * time.Millisecond) // rank 0 waits alone until its context ends
			return nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		err := c.Barrier(ctx)
		var oe *collective.OpError
		if !errors.Is(err, collective.ErrTimeout) || !errors.As(err, &oe) || oe.Rank != 0 || oe.Peer != 1 || oe.Op != "barrier" {
			return fmt.Errorf("barrier past its deadline: %v", err)
		}
		return nil
	})
}

// TestNodesInProcess runs the inter-node algorithms under the race
// detector, and checks that their planned runs allocate nothing. With
// SendCopyMin 1 the own block's copy rides with the first send from any
// size: from 64 KiB on in the connections' writers, in chunks (1 MiB + 3
// bytes: two stripes of three chunks each).
func TestNodesInProcess(t *testing.T) {
	for _, tc := range []struct {
		algo         string
		nodes, local int
		sendCopyMin  int
	}{{"hier", 2, 2, 0}, {"ring", 2, 2, 0}, {"hier", 2, 1, 1}, {"ring", 3, 1, 1}, {"hier", 2, 1, -1}} {
		t.Run(fmt.Sprintf("%s-%dx%d-sendcopy%d", tc.algo, tc.nodes, tc.local, tc.sendCopyMin), func(t *testing.T) {
			tune := func(o *collective.Options) { o.Algo, o.SendCopyMin = tc.algo, tc.sendCopyMin }
			inProcessNodes(t, tc.nodes, tc.local, tune, func(c *collective.Communicator) error {
				// A context that can be cancelled: its watch is kept from
				// call to call (inter.Transport.Watch).
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				P, me := c.Size(), c.Rank()
				if c.Nodes() != tc.nodes {
					return fmt.Errorf("%d nodes", c.Nodes())
				}
				for _, n := range []int{0, 3, 70_000, 300_001, 1<<20 + 3} {
					src, dst := make([]byte, n), make([]byte, P*n)
					plan, err := c.Plan(dst, src)
					if err != nil {
						return err
					}
					for it := range 3 {
						pattern.Fill(src, pattern.Seed(me, it, 1))
						if err := plan.Run(ctx); err != nil {
							return err
						}
						for r := range P {
							if i := pattern.Check(dst[r*n:r*n+n], pattern.Seed(r, it, 1)); i >= 0 {
								return fmt.Errorf("%d bytes: rank %d's block wrong at %d", n, r, i)
							}
						}
					}
					for _, ctx := range []context.Context{ctx, context.Background()} {
						allocs, err := testranks.AllocsPerRun(c, func() error { return plan.Run(ctx) })
						if err != nil {
							return err
						}
						if allocs != 0 {
							return fmt.Errorf("%d bytes: a planned run allocated %v times", n, allocs)
						}
					}
				}
				return c.Barrier(ctx)
			})
		})
	}
}

// TestStripedMismatchInProcess: across two nodes with four connections per
// peer pair, one rank's call disagrees with the others' about its block's
// size, on either side of the sizes where a message moves from one
// connection to several. Every rank must get ErrSizeMismatch, and the
// streams must stay in step: the next, agreeing call is right everywhere.
func TestStripedMismatchInProcess(t *testing.T) {
	const liar = 1
	for _, tc := range []struct{ want, told int }{
		{100, 3<<20 + 5},     // expected: one direct frame; sent: four stripes
		{3<<20 + 5, 100},     // the other way round
		{300_000, 2<<20 + 1}, // one direct frame, read at its low-water mark; four stripes
		{1<<20 + 1, 3 << 20}, // three stripes; four
		{5 << 20, 5<<20 + 1}, // the same stripes, one byte more
	} {
		t.Run(fmt.Sprintf("%d-told-%d", tc.want, tc.told), func(t *testing.T) {
			inProcessNodes(t, 2, 1, func(o *collective.Options) { o.Channels = 4 }, func(c *collective.Communicator) error {
				ctx := context.Background()
				P, me := c.Size(), c.Rank()
				counts := make([]int, P)
				for r := range counts {
					counts[r] = tc.want
				}
				mine := counts
				if me == liar {
					mine = slices.Clone(counts)
					mine[liar] = tc.told
				}
				src := make([]byte, mine[me])
				pattern.Fill(src, pattern.Seed(me, 9, 1))
				err := c.AllGatherV(ctx, make([]byte, P*max(tc.want, tc.told)), src, mine)
				var oe *collective.OpError
				if !errors.Is(err, collective.ErrSizeMismatch) || !errors.As(err, &oe) || oe.Peer < 0 {
					return fmt.Errorf("rank %d: err = %v, want ErrSizeMismatch naming a peer", me, err)
				}
				for it := range 2 {
					n := []int{tc.want, 3<<20 + 7}[it]
					src, dst := make([]byte, n), make([]byte, P*n)
					pattern.Fill(src, pattern.Seed(me, it, 2))
					if err := c.AllGather(ctx, dst, src); err != nil {
						return fmt.Errorf("rank %d, after the mismatch: %v", me, err)
					}
					for r := range P {
						if i := pattern.Check(dst[r*n:r*n+n], pattern.Seed(r, it, 2)); i >= 0 {
							return fmt.Errorf("rank %d, after the mismatch: rank %d's block wrong at %d", me, r, i)
						}
					}
				}
				return nil
			})
		})
	}
}
