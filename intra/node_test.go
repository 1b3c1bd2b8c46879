package intra

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/internal/teststore"
	"github.com/slimego/slimego/rendezvous"
)

// nodeMem is what the NodeGather scenario needs of an engine's memory
// beyond Memory: allocation and copies from and to the host.
type nodeMem[M any] struct {
	alloc func(n int) (M, error)
	put   func(dst M, src []byte) error
	get   func(dst []byte, src M) error
}

// nodeScenario runs one rank's part of the NodeGather scenario: gathers of
// random odd-sized blocks (one empty, some of several GPU rounds) checked
// byte for byte over two calls, a re-plan to other sizes, the barrier, and
// last a call (of blocks within one GPU round) in which local rank 0 runs
// RunMismatched: every rank must return ErrSizeMismatch.
func nodeScenario[M any](ng NodeGather[M], mem nodeMem[M]) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	L, me := ng.Size(), ng.Rank()
	layout := func(seed uint64) (sizes, offs []int, total int) {
		rng := rand.New(rand.NewPCG(seed, 1))
		sizes, offs = make([]int, L), make([]int, L)
		for s := range L {
			sizes[s] = 2*rng.IntN(9000) + 1
			if s == 1 {
				sizes[s] = 0
			}
			offs[s], total = total, total+sizes[s]+1
		}
		return sizes, offs, total
	}
	block := func(s, it, n int) []byte {
		b := make([]byte, n)
		rng := rand.New(rand.NewPCG(uint64(s), uint64(it)))
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	dst, err := mem.alloc(64 << 10)
	if err != nil {
		return err
	}
	src, err := mem.alloc(32 << 10)
	if err != nil {
		return err
	}
	var op NodeOp[M]
	for it, seed := range []uint64{1, 1, 2} {
		sizes, offs, total := layout(seed)
		s := ng.Slice(src, 0, sizes[me])
		d := ng.Slice(dst, 0, total)
		if err := mem.put(s, block(me, it, sizes[me])); err != nil {
			return err
		}
		if err := mem.put(d, make([]byte, total)); err != nil {
			return err
		}
		if op == nil {
			op, err = ng.Plan("allgather", d, s, sizes, offs)
		} else {
			err = op.Set(d, s, sizes, offs)
		}
		if err != nil {
			return err
		}
		if err := op.Run(ctx); err != nil {
			return fmt.Errorf("call %d: %w", it, err)
		}
		got := make([]byte, total)
		if err := mem.get(got, d); err != nil {
			return err
		}
		want := make([]byte, total)
		for q := range L {
			copy(want[offs[q]:], block(q, it, sizes[q]))
		}
		if !bytes.Equal(got, want) {
			return fmt.Errorf("call %d: the gathered blocks differ", it)
		}
	}
	if err := ng.Barrier(ctx); err != nil {
		return err
	}
	// The mismatch within one round of the GPU kernel (blocks within its
	// 4 KiB scratch block): see gpuNodeOp.RunMismatched for why.
	small, offs := make([]int, L), make([]int, L)
	for s := range L {
		small[s], offs[s] = 1001+s, 2000*s
	}
	if err := op.Set(ng.Slice(dst, 0, 2000*L), ng.Slice(src, 0, small[me]), small, offs); err != nil {
		return err
	}
	if me == 0 {
		err = op.RunMismatched(ctx)
	} else {
		err = op.Run(ctx)
	}
	if !errors.Is(err, fault.ErrSizeMismatch) {
		return fmt.Errorf("call with local rank 0 mismatched: %v, want ErrSizeMismatch", err)
	}
	return nil
}

// TestNodeGatherEngines runs one scenario through the NodeGather interface
// on both node-local engines: the shared-memory group (host memory) and the
// CUDA LL group (device spans, on the emulator under make test), three
// in-process ranks each.
func TestNodeGatherEngines(t *testing.T) {
	const L = 3
	t.Run("shm", func(t *testing.T) {
		errs := group(t, L, Config{Timeout: 20 * time.Second}, func(g *Group) error {
			mem := nodeMem[[]byte]{
				alloc: func(n int) ([]byte, error) { return make([]byte, n), nil },
				put:   func(d, s []byte) error { copy(d, s); return nil },
				get:   func(d, s []byte) error { copy(d, s); return nil },
			}
			return nodeScenario(g.Node(), mem)
		})
		for r, err := range errs {
			if err != nil {
				t.Errorf("rank %d: %v", r, err)
			}
		}
	})
	t.Run("cuda", func(t *testing.T) {
		ndev, err := device.CUDADeviceCount()
		if err != nil {
			t.Fatalf("no CUDA library (%v): TestMain points SLIME_CUDA_LIB at the emulator", err)
		}
		errs := teststore.Run(t, L, 60*time.Second, func(ctx context.Context, st *rendezvous.Client, r int) error {
			dev, err := device.OpenGPU(r % ndev)
			if err != nil {
				return err
			}
			g, err := NewGPU(ctx, GPUConfig{Store: st, Key: "node", Rank: r, Size: L, Dev: dev, Cap: 4096, Timeout: 20 * time.Second})
			if err != nil {
				return err
			}
			defer g.Close(ctx)
			ng, err := g.Node()
			if err != nil {
				return err
			}
			defer ng.Close()
			// Copies on a stream of the test's own: what Run
			// leaves must be complete when it returns.
			m, err := NewGPUMem(dev)
			if err != nil {
				return err
			}
			defer m.S.Close()
			var bufs []*device.CUDABuffer
			defer func() {
				for _, b := range bufs {
					b.Free()
				}
			}()
			deadline := time.Now().Add(30 * time.Second)
			mem := nodeMem[DevSpan]{
				alloc: func(n int) (DevSpan, error) {
					b, err := dev.Alloc(n)
					if err != nil {
						return DevSpan{}, err
					}
					bufs = append(bufs, b)
					return Span(b), nil
				},
				put: func(d DevSpan, s []byte) error { return m.CopyIn(d, s, deadline) },
				get: func(d []byte, s DevSpan) error { return m.CopyOut(d, s, deadline) },
			}
			return nodeScenario[DevSpan](ng, mem)
		})
		for r, err := range errs {
			if err != nil {
				t.Errorf("rank %d: %v", r, err)
			}
		}
	})
}

// TestGPUNodeGivesUpAtDeadline: a GPU node whose peer never comes returns
// ErrTimeout when the caller's context ends, long before the kernel's own
// timeout, and is broken from then on: the next call refuses at once
// rather than launching behind a kernel still in flight.
func TestGPUNodeGivesUpAtDeadline(t *testing.T) {
	done := make(chan struct{})
	errs := teststore.Run(t, 2, 60*time.Second, func(ctx context.Context, st *rendezvous.Client, r int) error {
		dev, err := device.OpenGPU(0)
		if err != nil {
			return err
		}
		g, err := NewGPU(ctx, GPUConfig{Store: st, Key: "late", Rank: r, Size: 2, Dev: dev, Timeout: 3 * time.Second})
		if err != nil {
			return err
		}
		defer g.Close(ctx)
		if r == 1 {
			<-done // never takes part
			return nil
		}
		defer close(done)
		ng, err := g.Node()
		if err != nil {
			return err
		}
		defer ng.Close()
		b, err := dev.Alloc(64)
		if err != nil {
			return err
		}
		defer b.Free()
		sizes, offs := []int{8, 8}, []int{0, 8}
		op, err := ng.Plan("allgather", DevSpan{Ptr: b.Ptr, N: 16}, DevSpan{Ptr: b.Ptr + 32, N: 8}, sizes, offs)
		if err != nil {
			return err
		}
		short, stop := context.WithTimeout(ctx, 100*time.Millisecond)
		defer stop()
		start := time.Now()
		err = op.Run(short)
		if !errors.Is(err, fault.ErrTimeout) || time.Since(start) > 2*time.Second {
			return fmt.Errorf("run with a peer that never comes: %v after %v, want ErrTimeout at the 100 ms deadline", err, time.Since(start))
		}
		start = time.Now()
		if err := op.Run(ctx); !errors.Is(err, fault.ErrTimeout) || time.Since(start) > time.Second {
			return fmt.Errorf("run after giving up: %v after %v, want the group broken at once", err, time.Since(start))
		}
		// The kernel gives up at its own timeout; its memory stays
		// until then.
		return ng.S.Synchronize(ctx)
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}
