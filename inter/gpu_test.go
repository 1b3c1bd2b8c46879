package inter

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/internal/teststore"
	"github.com/slimego/slimego/intra"
	"github.com/slimego/slimego/rendezvous"
)

// gpuAG is Hier or the ring over device spans.
type gpuAG interface {
	run(ctx context.Context, name string, dst, src intra.DevSpan, sizes, offs []int) error
	barrier(ctx context.Context) error
}

type gpuHier struct{ *HierOver[intra.DevSpan] }

func (h gpuHier) run(ctx context.Context, name string, dst, src intra.DevSpan, sizes, offs []int) error {
	op, err := h.Plan(name, dst, src, sizes, offs)
	if err != nil {
		return err
	}
	return op.Run(ctx)
}
func (h gpuHier) barrier(ctx context.Context) error { return h.Barrier(ctx) }

type gpuRing struct{ *RingOver[intra.DevSpan] }

func (r gpuRing) run(ctx context.Context, name string, dst, src intra.DevSpan, sizes, offs []int) error {
	op, err := r.Plan(name, dst, src, sizes, offs)
	if err != nil {
		return err
	}
	return op.Run(ctx)
}
func (r gpuRing) barrier(ctx context.Context) error { return r.Barrier(ctx) }

// gpuRank is one in-process rank of a GPU job across nodes: its device,
// the memory model it copies with, and the algorithm.
type gpuRank struct {
	rank int
	dev  *device.GPU
	mem  intra.GPUMem
	ag   gpuAG
}

// gpuCluster starts nodes × local ranks in this process, as a GPU job
// across nodes: each rank has a CUDA LL group of its node (the node-local
// gather), a TCP transport over loopback to its rail peers or ring
// neighbours, carried by the host-staged GPU link, and Hier or the ring
// built over those two by NewHierOver and NewRingOver. Rank r runs on GPU
// r mod the emulator's devices. body runs on each rank.
func gpuCluster(t *testing.T, nodes, local int, ring bool, body func(r gpuRank) error) []error {
	t.Helper()
	ndev, err := device.CUDADeviceCount()
	if err != nil {
		t.Fatalf("no CUDA library (%v): TestMain points SLIME_CUDA_LIB at the emulator", err)
	}
	P := nodes * local
	return teststore.Run(t, P, 90*time.Second, func(ctx context.Context, st *rendezvous.Client, r int) error {
		dev, err := device.OpenGPU(r % ndev)
		if err != nil {
			return err
		}
		a := r / local
		// A small scratch block: the larger blocks take several
		// kernel rounds.
		g, err := intra.NewGPU(ctx, intra.GPUConfig{Store: st, Key: fmt.Sprintf("gnode%d", a), Rank: r % local,
			Size: local, Ranks: nodeRanks(local, r), Dev: dev, Cap: 4096, Timeout: 20 * time.Second})
		if err != nil {
			return err
		}
		defer g.Close(ctx)
		node, err := g.Node()
		if err != nil {
			return err
		}
		defer node.Close()
		link, err := stagedLink(ctx, st, "gnet", r, peersOf(nodes, local, r, ring), dev)
		if err != nil {
			return err
		}
		defer link.Close()
		var ag gpuAG = gpuHier{NewHierOver(intra.NodeGather[intra.DevSpan](node), Link[intra.DevSpan](link), nodes, local, r, 20*time.Second)}
		if ring {
			ag = gpuRing{NewRingOver(Link[intra.DevSpan](link), P, r, 20*time.Second)}
		}
		// The test copies on a stream of its own: what Run leaves
		// must be complete when it returns, whatever stream reads it.
		mem, err := intra.NewGPUMem(dev)
		if err != nil {
			return err
		}
		defer mem.S.Close()
		return body(gpuRank{rank: r, dev: dev, mem: mem, ag: ag})
	})
}

// stagedLink is rank r's host-staged GPU link of dev to peers, over a TCP
// transport on loopback (two connections each) that it closes with it.
func stagedLink(ctx context.Context, st *rendezvous.Client, key string, r int, peers []int, dev *device.GPU) (*Staged, error) {
	tr, err := New(ctx, Config{Store: st, Key: key, Rank: r, Peers: peers, Channels: 2,
		MasterAddr: "127.0.0.1", Timeout: 20 * time.Second, Auth: testKey})
	if err != nil {
		return nil, err
	}
	link, err := NewStaged(tr, dev)
	if err != nil {
		tr.Close()
		return nil, err
	}
	return link, nil
}

// TestGPUAcrossNodes: a GPU job of 2 nodes × 2 ranks (and 3 × 2, and 2 × 1)
// in one process, on the emulated CUDA library over loopback TCP, runs the
// rail-aligned hierarchical all-gather and the ring by construction: the
// CUDA LL group is the node-local gather and the host-staged link the
// transport. Every rank's block is random, of an odd size (one empty, some
// of several kernel rounds and larger than a TCP stripe), and every rank's
// destination must equal the concatenation byte for byte, out of place and
// in place, over several calls (epochs) with new data each time; the
// barrier runs between calls. The emulator delays every stream operation
// at random, so a staging copy not waited for shows up as stale bytes.
func TestGPUAcrossNodes(t *testing.T) {
	for _, tc := range []struct {
		name         string
		nodes, local int
		ring         bool
	}{
		{"hier/2x2", 2, 2, false},
		{"ring/2x2", 2, 2, true},
		{"hier/3x2", 3, 2, false},
		{"hier/2x1", 2, 1, false},
		{"ring/3x1", 3, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			P := tc.nodes * tc.local
			sizes := make([]int, P)
			for r := range sizes {
				sizes[r] = []int{5003, 1, 700001, 0, 12345, 77}[r%6]
			}
			offs := make([]int, P)
			total := 0
			for r, n := range sizes {
				offs[r], total = total, total+n+3 // gaps between blocks stay untouched
			}
			total += 5
			const iters = 3
			blocks := make([][][]byte, iters) // [iteration][rank]
			for it := range blocks {
				blocks[it] = make([][]byte, P)
				for r := range P {
					rng := rand.New(rand.NewPCG(uint64(it), uint64(r)))
					b := make([]byte, sizes[r])
					for i := range b {
						b[i] = byte(rng.Uint32())
					}
					blocks[it][r] = b
				}
			}
			errs := gpuCluster(t, tc.nodes, tc.local, tc.ring, func(g gpuRank) error {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				deadline := time.Now().Add(30 * time.Second)
				dstB, err := g.dev.Alloc(total)
				if err != nil {
					return err
				}
				defer dstB.Free()
				srcB, err := g.dev.Alloc(max(sizes[g.rank], 1))
				if err != nil {
					return err
				}
				defer srcB.Free()
				dst := intra.Span(dstB)
				src := intra.DevSpan{Ptr: srcB.Ptr, N: sizes[g.rank]}
				const fill = 0xA5
				host := make([]byte, total)
				for it := range iters {
					for _, inPlace := range []bool{false, true} {
						for i := range host {
							host[i] = fill
						}
						s := src
						if inPlace {
							s = g.mem.Slice(dst, offs[g.rank], sizes[g.rank])
							copy(host[offs[g.rank]:], blocks[it][g.rank])
						} else if err := g.mem.CopyIn(src, blocks[it][g.rank], deadline); err != nil {
							return err
						}
						if err := g.mem.CopyIn(dst, host, deadline); err != nil {
							return err
						}
						if err := g.ag.run(ctx, "allgather", dst, s, sizes, offs); err != nil {
							return fmt.Errorf("iteration %d (in place %v): %w", it, inPlace, err)
						}
						got := make([]byte, total)
						if err := g.mem.CopyOut(got, dst, deadline); err != nil {
							return err
						}
						want := bytes.Repeat([]byte{fill}, total)
						for q := range P {
							copy(want[offs[q]:], blocks[it][q])
						}
						if !bytes.Equal(got, want) {
							i := 0
							for got[i] == want[i] {
								i++
							}
							return fmt.Errorf("iteration %d (in place %v): destination differs first at byte %d (%#x, want %#x)", it, inPlace, i, got[i], want[i])
						}
						if err := g.ag.barrier(ctx); err != nil {
							return fmt.Errorf("barrier after iteration %d: %w", it, err)
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
		})
	}
}

// TestGPUAcrossNodesMismatch: in a GPU job of 2 nodes × 2 ranks (and
// 3 × 2), one rank calls with another size for its own block. Every rank
// must return ErrSizeMismatch, none after waiting for its timeout: the
// liar's rail peers learn it from the link and pass it on through their
// node's kernel (RunMismatched). A GPU group is broken by a size mismatch,
// so the next call, though every rank agrees, is ErrSizeMismatch again on
// every rank, at once.
func TestGPUAcrossNodesMismatch(t *testing.T) {
	for _, tc := range []struct {
		nodes, local, liar int
		ring               bool
	}{
		{2, 2, 0, false}, {2, 2, 1, false}, {2, 2, 3, false}, {3, 2, 4, false},
		{2, 2, 1, true}, {3, 2, 2, true},
	} {
		t.Run(fmt.Sprintf("%dx%d/liar%d/ring=%v", tc.nodes, tc.local, tc.liar, tc.ring), func(t *testing.T) {
			P := tc.nodes * tc.local
			start := time.Now()
			errs := gpuCluster(t, tc.nodes, tc.local, tc.ring, func(g gpuRank) error {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				dstB, err := g.dev.Alloc(P * 2000)
				if err != nil {
					return err
				}
				defer dstB.Free()
				dst := intra.Span(dstB)
				for call, lie := range []bool{true, false} {
					sizes, offs := make([]int, P), make([]int, P)
					for r := range P {
						sizes[r], offs[r] = 1000+r, r*2000
					}
					if lie && g.rank == tc.liar {
						sizes[tc.liar]++
					}
					src := g.mem.Slice(dst, offs[g.rank], sizes[g.rank])
					err = g.ag.run(ctx, "allgather", dst, src, sizes, offs)
					if tc.ring && !lie {
						// The ring has no node gather: the call after a
						// mismatch is right.
						if err != nil {
							return fmt.Errorf("call %d: %v", call, err)
						}
						continue
					}
					if !errors.Is(err, fault.ErrSizeMismatch) {
						return fmt.Errorf("call %d: %v, want ErrSizeMismatch", call, err)
					}
				}
				return nil
			})
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
			if el := time.Since(start); el > 15*time.Second {
				t.Errorf("the mismatch took %v to reach every rank: some waited for a timeout", el)
			}
		})
	}
}

// TestGPUAcrossNodesNoAllocs: a planned GPU all-gather across nodes (Hier
// and the ring over the CUDA LL group and the host-staged link) allocates
// nothing once it has run: rank 0 measures process-wide allocations per
// run while the other ranks run alongside, so an allocation on any rank
// shows.
func TestGPUAcrossNodesNoAllocs(t *testing.T) {
	for _, ring := range []bool{false, true} {
		t.Run(fmt.Sprintf("ring=%v", ring), func(t *testing.T) {
			const nodes, local, runs = 2, 2, 101
			P := nodes * local
			var allocs float64
			errs := gpuCluster(t, nodes, local, ring, func(g gpuRank) error {
				ctx := context.Background()
				sizes, offs := make([]int, P), make([]int, P)
				for r := range P {
					sizes[r], offs[r] = 9001+r, r*10000
				}
				dstB, err := g.dev.Alloc(P * 10000)
				if err != nil {
					return err
				}
				defer dstB.Free()
				srcB, err := g.dev.Alloc(sizes[g.rank])
				if err != nil {
					return err
				}
				defer srcB.Free()
				var op interface{ Run(context.Context) error }
				if h, ok := g.ag.(gpuHier); ok {
					op, err = h.Plan("allgather", intra.Span(dstB), intra.Span(srcB), sizes, offs)
				} else {
					op, err = g.ag.(gpuRing).Plan("allgather", intra.Span(dstB), intra.Span(srcB), sizes, offs)
				}
				if err != nil {
					return err
				}
				if err := op.Run(ctx); err != nil {
					return err
				}
				// Three measurements, the least kept: an allocation of every
				// run shows in all three, while one the runtime makes now and
				// then in this process (other ranks' goroutines are counted
				// too) does not fail the test.
				const tries = 3
				if g.rank != 0 {
					for range tries * runs {
						if err := op.Run(ctx); err != nil {
							return err
						}
					}
					return nil
				}
				var runErr error
				allocs = -1
				for range tries {
					a := testing.AllocsPerRun(runs-1, func() {
						if err := op.Run(ctx); err != nil && runErr == nil {
							runErr = err
						}
					})
					if allocs < 0 || a < allocs {
						allocs = a
					}
				}
				return runErr
			})
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
			if allocs >= 1 {
				t.Errorf("a planned run allocated %v times", allocs)
			}
		})
	}
}

// TestStaged: the host-staged GPU link on its own. SendCopy sends its
// block and copies it into also (which the algorithms never ask of it,
// CopyRides being false, but which it promises). A send or receive whose
// pinned staging memory cannot be allocated (a block larger than any
// host) is the error WaitSend or WaitRecv returns, naming the peer, and
// nothing is sent.
func TestStaged(t *testing.T) {
	ndev, err := device.CUDADeviceCount()
	if err != nil {
		t.Fatalf("no CUDA library (%v): TestMain points SLIME_CUDA_LIB at the emulator", err)
	}
	errs := teststore.Run(t, 2, 60*time.Second, func(ctx context.Context, st *rendezvous.Client, r int) error {
		dev, err := device.OpenGPU(r % ndev)
		if err != nil {
			return err
		}
		link, err := stagedLink(ctx, st, "snet", r, []int{1 - r}, dev)
		if err != nil {
			return err
		}
		defer link.Close()
		d := time.Now().Add(5 * time.Second)
		mem, err := intra.NewGPUMem(dev)
		if err != nil {
			return err
		}
		defer mem.S.Close()
		const n = 3000
		want := make([]byte, n)
		for i := range want {
			want[i] = byte(i*7 + 1)
		}
		b, err := dev.Alloc(2 * n)
		if err != nil {
			return err
		}
		defer b.Free()
		buf, also := intra.DevSpan{Ptr: b.Ptr, N: n}, intra.DevSpan{Ptr: b.Ptr + n, N: n}
		got := make([]byte, n)
		if r == 0 {
			if err := mem.CopyIn(buf, want, d); err != nil {
				return err
			}
			link.SendCopy(1, 1, 0, buf, also, d)
			if err := link.WaitSend(1); err != nil {
				return err
			}
			if err := mem.CopyOut(got, also, d); err != nil {
				return err
			}
		} else {
			link.Recv(0, 1, 0, buf, d)
			if err := link.WaitRecv(0); err != nil {
				return err
			}
			if err := mem.CopyOut(got, buf, d); err != nil {
				return err
			}
		}
		if !bytes.Equal(got, want) {
			return fmt.Errorf("SendCopy: rank %d's copy differs", r)
		}
		huge := intra.DevSpan{N: 1 << 50}
		if r == 0 {
			link.Send(1, 2, 0, huge, d)
			if err := link.WaitSend(1); err == nil || !strings.Contains(err.Error(), "rank 1") {
				return fmt.Errorf("a send whose staging cannot be allocated: WaitSend says %v", err)
			}
			return nil
		}
		link.Recv(0, 2, 0, huge, d)
		if err := link.WaitRecv(0); err == nil || !strings.Contains(err.Error(), "rank 0") {
			return fmt.Errorf("a receive whose staging cannot be allocated: WaitRecv says %v", err)
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}
