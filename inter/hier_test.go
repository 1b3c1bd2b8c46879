package inter

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/internal/teststore"
	"github.com/slimego/slimego/intra"
	"github.com/slimego/slimego/rendezvous"
)

// allGatherer is what Hier and RingAG have in common for the tests.
type allGatherer interface {
	run(ctx context.Context, name string, dst, src []byte, sizes, offs []int) error
	barrier(ctx context.Context) error
	// closeLinks closes the rank's transport (its sockets) now, before
	// cluster's deferred Close.
	closeLinks()
}

type hierAG struct {
	*Hier
	tr *Transport
}

func (h hierAG) run(ctx context.Context, name string, dst, src []byte, sizes, offs []int) error {
	op, err := h.Plan(name, dst, src, sizes, offs)
	if err != nil {
		return err
	}
	return op.Run(ctx)
}
func (h hierAG) barrier(ctx context.Context) error { return h.Barrier(ctx) }
func (h hierAG) closeLinks()                       { h.tr.Close() }

type ringAG struct {
	*RingAG
	tr *Transport
}

func (r ringAG) run(ctx context.Context, name string, dst, src []byte, sizes, offs []int) error {
	op, err := r.Plan(name, dst, src, sizes, offs)
	if err != nil {
		return err
	}
	return op.Run(ctx)
}
func (r ringAG) barrier(ctx context.Context) error { return r.Barrier(ctx) }
func (r ringAG) closeLinks()                       { r.tr.Close() }

// cluster starts nodes × local ranks in this process, each with its
// node's intra-node group and a transport to its peers (the rail peers, or
// the ring's neighbours when ring), and runs body on each with its global
// rank. Nodes differ only in their groups' store keys and segment names.
func cluster(t *testing.T, nodes, local int, ring bool, body func(rank int, ag allGatherer) error) []error {
	return clusterWith(t, nodes, local, ring, 0, body)
}

// clusterWith is cluster with the transports' SendCopyMin (0: the default).
func clusterWith(t *testing.T, nodes, local int, ring bool, sendCopyMin int, body func(rank int, ag allGatherer) error) []error {
	t.Helper()
	P := nodes * local
	prefix := fmt.Sprintf("slimego-intertest-%d-", os.Getpid())
	errs := teststore.Run(t, P, 60*time.Second, func(ctx context.Context, st *rendezvous.Client, r int) error {
		a := r / local
		g, err := intra.New(ctx, intra.Config{Store: st, Key: fmt.Sprintf("node%d", a),
			ShmPrefix: fmt.Sprintf("%s%d-", prefix, a), Rank: r % local, Size: local, Ranks: nodeRanks(local, r),
			Timeout: 10 * time.Second})
		if err != nil {
			return err
		}
		defer g.Close()
		tr, err := New(ctx, Config{Store: st, Key: "net", Rank: r, Peers: peersOf(nodes, local, r, ring), Channels: 2,
			MasterAddr: "127.0.0.1", Timeout: 10 * time.Second, Auth: testKey, SendCopyMin: sendCopyMin})
		if err != nil {
			return err
		}
		defer tr.Close()
		if ring {
			return body(r, ringAG{NewRing(tr, P, r, 10*time.Second), tr})
		}
		return body(r, hierAG{NewHier(g, tr, nodes, local, r, 10*time.Second), tr})
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

func fillBlock(b []byte, rank, it int) {
	rng := rand.New(rand.NewPCG(uint64(rank), uint64(it)))
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
}

// layoutOf is the offsets of blocks of the given sizes packed in order.
func layoutOf(sizes []int) (offs []int, total int) {
	offs = make([]int, len(sizes))
	for r, n := range sizes {
		offs[r] = total
		total += n
	}
	return offs, total
}

// nodeRanks is the global ranks of rank r's node in a test cluster of
// local ranks per node.
func nodeRanks(local, r int) []int {
	ranks := make([]int, local)
	for i := range ranks {
		ranks[i] = r/local*local + i
	}
	return ranks
}

// peersOf is rank r's transport peers in a test cluster of nodes × local
// ranks: its rail peers, or its ring neighbours when ring.
func peersOf(nodes, local, r int, ring bool) []int {
	if ring {
		return RingPeers(nodes*local, r)
	}
	return RailPeers(nodes, local, r)
}

// TestHierAndRing: the hierarchical all-gather with one, two and three
// ranks per node, and the flat ring, deliver every rank's block to every
// rank, out of place and in place (src the rank's own block of dst), with
// blocks of different sizes (AllGatherV), three calls each.
func TestHierAndRing(t *testing.T) {
	// ride: every out-of-place block's own copy rides with its first
	// send (SendCopyMin 1) where the algorithm allows it.
	cases := []struct {
		nodes, local int
		ring, ride   bool
	}{
		{2, 1, false, false}, {2, 2, false, false}, {3, 2, false, false}, {2, 3, false, false},
		{1, 2, false, false}, {3, 1, true, false}, {4, 1, true, false}, {2, 1, true, false},
		{2, 1, false, true}, {3, 1, false, true}, {2, 2, false, true}, {3, 1, true, true}, {1, 1, true, true},
	}
	for _, c := range cases {
		for _, n := range []int{0, 5, 70_001, 1<<20 + 7} {
			name := fmt.Sprintf("%dx%d/ring=%v/ride=%v/n%d", c.nodes, c.local, c.ring, c.ride, n)
			t.Run(name, func(t *testing.T) {
				P := c.nodes * c.local
				sizes := make([]int, P)
				for r := range P {
					sizes[r] = n + r%3 // unequal blocks
					if n == 0 {
						sizes[r] = 0
					}
				}
				offs, total := layoutOf(sizes)
				sendCopyMin := 0
				if c.ride {
					sendCopyMin = 1
				}
				errs := clusterWith(t, c.nodes, c.local, c.ring, sendCopyMin, func(rank int, ag allGatherer) error {
					ctx := context.Background()
					want := make([]byte, total)
					for it := range 3 {
						for q := range P {
							fillBlock(want[offs[q]:offs[q]+sizes[q]], q, it)
						}
						dst := make([]byte, total)
						fillBlock(dst, 999, it) // stale bytes everywhere
						inPlace := it == 1
						src := make([]byte, sizes[rank])
						if inPlace {
							src = dst[offs[rank] : offs[rank]+sizes[rank]]
						}
						fillBlock(src, rank, it)
						if err := ag.run(ctx, "allgather", dst, src, sizes, offs); err != nil {
							return fmt.Errorf("call %d: %w", it, err)
						}
						if !bytes.Equal(dst, want) {
							for q := range P {
								if !bytes.Equal(dst[offs[q]:offs[q]+sizes[q]], want[offs[q]:offs[q]+sizes[q]]) {
									return fmt.Errorf("call %d (in place %v): block of rank %d wrong", it, inPlace, q)
								}
							}
						}
					}
					return ag.barrier(ctx)
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

// TestHierRingMismatch: one rank that passes other sizes than the rest
// makes every rank of every node return ErrSizeMismatch, and the
// communicator stays usable: the next call, which agrees, delivers.
func TestHierRingMismatch(t *testing.T) {
	cases := []struct {
		nodes, local int
		ring         bool
		odd, n       int
	}{
		{2, 2, false, 3, 100}, {2, 2, false, 1, 600_000}, {2, 2, false, 0, 100},
		{3, 1, true, 1, 100}, {3, 1, true, 2, 1<<20 + 1},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%dx%d/ring=%v/odd%d/n%d", c.nodes, c.local, c.ring, c.odd, c.n), func(t *testing.T) {
			P := c.nodes * c.local
			errs := cluster(t, c.nodes, c.local, c.ring, func(rank int, ag allGatherer) error {
				ctx := context.Background()
				m := c.n
				if rank == c.odd {
					m++
				}
				sizes := make([]int, P)
				for q := range sizes {
					sizes[q] = m
				}
				offs, total := layoutOf(sizes)
				err := ag.run(ctx, "allgather", make([]byte, total), make([]byte, m), sizes, offs)
				if !errors.Is(err, fault.ErrSizeMismatch) {
					return fmt.Errorf("want ErrSizeMismatch, got %v", err)
				}
				var oe *fault.OpError
				if !errors.As(err, &oe) || oe.Rank != rank || oe.Peer < 0 || oe.Peer >= P || oe.Peer == rank {
					return fmt.Errorf("the error names rank %d peer %d: %v", oe.Rank, oe.Peer, err)
				}
				// Across two nodes the odd rank's counterpart on the other
				// node (rank ± local) receives its block over the network
				// before anything of its own node disagrees: it names the
				// odd rank. (The odd rank itself names a rank of its own
				// node, whose blocks it compares first.)
				if !c.ring && c.nodes == 2 {
					if partner := (c.odd + c.local) % P; rank == partner && oe.Peer != c.odd {
						return fmt.Errorf("the error names peer %d, want the network peer whose size differs: %v", oe.Peer, err)
					}
				}
				// Usable afterwards.
				for q := range sizes {
					sizes[q] = 64
				}
				offs, total = layoutOf(sizes)
				dst, src := make([]byte, total), make([]byte, 64)
				fillBlock(src, rank, 7)
				if err := ag.run(ctx, "allgather", dst, src, sizes, offs); err != nil {
					return fmt.Errorf("after the mismatch: %w", err)
				}
				for q := range P {
					want := make([]byte, 64)
					fillBlock(want, q, 7)
					if !bytes.Equal(dst[offs[q]:offs[q]+64], want) {
						return fmt.Errorf("after the mismatch: block of rank %d wrong", q)
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

// TestHierInvalid: calls that do not fit are ErrInvalid on the calling
// rank alone, before anything moves.
func TestHierInvalid(t *testing.T) {
	errs := cluster(t, 2, 1, false, func(rank int, ag allGatherer) error {
		ctx := context.Background()
		bad := []struct {
			dst, src    []byte
			sizes, offs []int
		}{
			{make([]byte, 16), make([]byte, 8), []int{8}, []int{0}},        // one size for two ranks
			{make([]byte, 15), make([]byte, 8), []int{8, 8}, []int{0, 8}},  // destination too short
			{make([]byte, 16), make([]byte, 7), []int{8, 8}, []int{0, 8}},  // source of another size
			{make([]byte, 16), make([]byte, 8), []int{8, -1}, []int{0, 8}}, // negative size
			{make([]byte, 16), make([]byte, 8), []int{8, 8}, []int{-1, 8}}, // negative offset
		}
		for i, b := range bad {
			err := ag.run(ctx, "allgather", b.dst, b.src, b.sizes, b.offs)
			var oe *fault.OpError
			if !errors.Is(err, fault.ErrInvalid) || !errors.As(err, &oe) || oe.Rank != rank || oe.Peer != -1 {
				return fmt.Errorf("case %d: want ErrInvalid of this rank naming no peer, got %v", i, err)
			}
		}
		return ag.barrier(ctx)
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// TestBarrierWaitsForEveryRank: neither algorithm's Barrier returns on a
// rank before every other rank has entered it; the last rank enters 100 ms
// after the others.
func TestBarrierWaitsForEveryRank(t *testing.T) {
	for _, ring := range []bool{false, true} {
		t.Run(fmt.Sprintf("ring=%v", ring), func(t *testing.T) {
			nodes, local := 2, 2
			if ring {
				nodes, local = 3, 1
			}
			P := nodes * local
			var entered atomic.Bool
			errs := cluster(t, nodes, local, ring, func(rank int, ag allGatherer) error {
				ctx := context.Background()
				if rank == P-1 {
					time.Sleep(100 * time.Millisecond) // the others wait in the barrier meanwhile
					entered.Store(true)
					return ag.barrier(ctx)
				}
				if err := ag.barrier(ctx); err != nil {
					return err
				}
				if !entered.Load() {
					return fmt.Errorf("the barrier returned before rank %d entered it", P-1)
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
