package collective_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/pattern"
	"github.com/slimego/slimego/internal/testranks"
)

// bufferRanks runs body on nodes × perNode ranks of the given backend
// (CUDA on the emulator), with the tests' small GPU scratch.
func bufferRanks(t *testing.T, backend device.Kind, nodes, perNode int, body func(c *collective.Communicator) error) {
	t.Helper()
	if backend == device.CUDA {
		needGPU(t)
	}
	testranks.Run(t, nodes, perNode, func(o *collective.Options) {
		o.Backend, o.GPUScratch, o.Timeout = backend, gpuScratch, 30*time.Second
	}, body)
}

// sliceOf is n bytes of b from off, a view of the same memory.
func sliceOf(b device.Buffer, off, n int) (device.Buffer, error) {
	switch b := b.(type) {
	case *device.HostBuffer:
		return device.NewHostBuffer(b.Bytes()[off:off+n], false), nil
	case *device.CUDABuffer:
		return b.Slice(off, n)
	}
	return nil, fmt.Errorf("a %T", b)
}

// gatherBuffers plans rank r's sizes[r] bytes at offs[r] of a dst of
// total bytes with plan (one of the PlanBuffers forms), and runs it iters
// times ordered on the communicator's stream: the source is copied in by
// a device copy enqueued on Stream() before Launch, the result copied out
// by one enqueued after it, then Synchronize and Check. Every byte of dst
// is checked, the bytes outside the blocks too.
func gatherBuffers(ctx context.Context, c *collective.Communicator, total int, sizes, offs []int, inPlace bool, iters int,
	plan func(dst, src device.Buffer) (*collective.Plan, error)) error {
	dev, s, me := c.Device(), c.Stream(), c.Rank()
	var bufs []device.Buffer
	defer func() {
		for _, b := range bufs {
			b.Free()
		}
	}()
	alloc := func(n int) (device.Buffer, error) {
		b, err := dev.NewBuffer(n)
		if err == nil {
			bufs = append(bufs, b)
		}
		return b, err
	}
	dst, err := alloc(total)
	if err != nil {
		return err
	}
	out, err := alloc(total)
	if err != nil {
		return err
	}
	stage, err := alloc(sizes[me])
	if err != nil {
		return err
	}
	var src device.Buffer
	if inPlace {
		src, err = sliceOf(dst, offs[me], sizes[me])
	} else {
		src, err = alloc(sizes[me])
	}
	if err != nil {
		return err
	}
	p, err := plan(dst, src)
	if err != nil {
		return err
	}
	defer p.Close()
	host, want := make([]byte, total), make([]byte, total)
	for it := range iters {
		pattern.Fill(want, uint64(0xfeed+it))
		if err := dst.CopyIn(want); err != nil {
			return err
		}
		for r := range sizes {
			pattern.Fill(want[offs[r]:offs[r]+sizes[r]], pattern.Seed(r, it, uint64(sizes[r])))
		}
		if err := stage.CopyIn(want[offs[me] : offs[me]+sizes[me]]); err != nil {
			return err
		}
		if err := dev.Copy(s, src, stage); err != nil {
			return err
		}
		if err := p.Launch(ctx); err != nil {
			return err
		}
		if err := dev.Copy(s, out, dst); err != nil {
			return err
		}
		if err := c.Synchronize(ctx, s); err != nil {
			return err
		}
		if err := p.Check(ctx); err != nil {
			return err
		}
		if err := out.CopyOut(host); err != nil {
			return err
		}
		if !bytes.Equal(host, want) {
			for j := range host {
				if host[j] != want[j] {
					return fmt.Errorf("%s, iteration %d: byte %d of dst is %#x, want %#x", p, it, j, host[j], want[j])
				}
			}
		}
	}
	allocs, err := testranks.AllocsPerRun(c, func() error { return p.Run(ctx) })
	if err != nil {
		return err
	}
	if allocs >= 1 {
		return fmt.Errorf("%s: %.1f allocations per planned run", p, allocs)
	}
	return nil
}

// The backend-neutral API moves the same bytes on both backends: equal
// blocks (PlanBuffers, also in place), uneven counts with an empty block
// (PlanBuffersV), and blocks at explicit offsets with gaps, rank order
// reversed (PlanBuffersBlocks), on one node of 2 and 3 ranks and across
// 2 nodes of 2; each run ordered between device copies on Stream(), every
// byte checked, and a planned Run allocates nothing.
func TestBuffersAPI(t *testing.T) {
	for _, backend := range []device.Kind{device.CPU, device.CUDA} {
		for _, top := range []struct{ nodes, perNode int }{{1, 2}, {1, 3}, {2, 2}} {
			t.Run(fmt.Sprintf("%v/%dx%d", backend, top.nodes, top.perNode), func(t *testing.T) {
				bufferRanks(t, backend, top.nodes, top.perNode, func(c *collective.Communicator) error {
					ctx := context.Background()
					if c.Device().Kind() != backend || c.Backend() != backend || c.Stream() == nil {
						return fmt.Errorf("device %v, backend %v, stream %v: want %v", c.Device(), c.Backend(), c.Stream(), backend)
					}
					P := c.Size()
					const n = 4097
					eq, eqOffs := make([]int, P), make([]int, P)
					for r := range P {
						eq[r], eqOffs[r] = n, r*n
					}
					for _, inPlace := range []bool{false, true} {
						if err := gatherBuffers(ctx, c, P*n, eq, eqOffs, inPlace, 2, func(dst, src device.Buffer) (*collective.Plan, error) {
							return c.PlanBuffers(ctx, dst, src)
						}); err != nil {
							return fmt.Errorf("PlanBuffers (in place %v): %w", inPlace, err)
						}
					}
					counts, packed, total := make([]int, P), make([]int, P), 0
					for r := range P {
						counts[r] = []int{70_001, 0, 5, 64 << 10}[r%4]
						packed[r] = total
						total += counts[r]
					}
					for _, inPlace := range []bool{false, true} {
						if err := gatherBuffers(ctx, c, total, counts, packed, inPlace, 2, func(dst, src device.Buffer) (*collective.Plan, error) {
							return c.PlanBuffersV(ctx, dst, src, counts)
						}); err != nil {
							return fmt.Errorf("PlanBuffersV (in place %v): %w", inPlace, err)
						}
					}
					sizes, offs, end := make([]int, P), make([]int, P), 7
					for r := P - 1; r >= 0; r-- {
						sizes[r], offs[r] = 1000+37*r, end
						end += sizes[r] + 13
					}
					if err := gatherBuffers(ctx, c, end, sizes, offs, false, 2, func(dst, src device.Buffer) (*collective.Plan, error) {
						return c.PlanBuffersBlocks(ctx, dst, src, sizes, offs)
					}); err != nil {
						return fmt.Errorf("PlanBuffersBlocks: %w", err)
					}
					return nil
				})
			})
		}
	}
}

// A buffer or stream of the other backend, of no backend, or a mix, is
// ErrInvalid naming the rank and the operation, at once and with no
// collective call begun, on both backends.
func TestBuffersWrongBackend(t *testing.T) {
	for _, backend := range []device.Kind{device.CPU, device.CUDA} {
		t.Run(backend.String(), func(t *testing.T) {
			bufferRanks(t, backend, 1, 2, func(c *collective.Communicator) error {
				ctx := context.Background()
				good, err := c.Device().NewBuffer(64)
				if err != nil {
					return err
				}
				defer good.Free()
				var other device.Buffer = &device.CUDABuffer{Len: 32}
				var otherStream device.Stream = &device.CUDAStream{}
				if backend == device.CUDA {
					other = device.NewHostBuffer(make([]byte, 32), false)
					cpu := device.NewCPUStream()
					defer cpu.Close()
					otherStream = cpu
				}
				for i, call := range []struct {
					op  string
					err func() error
				}{
					{"allgather", func() error { _, err := c.PlanBuffers(ctx, other, other); return err }},
					{"allgather", func() error { _, err := c.PlanBuffers(ctx, good, other); return err }},
					{"allgather", func() error { _, err := c.PlanBuffers(ctx, other, good); return err }},
					{"allgather", func() error { _, err := c.PlanBuffers(ctx, nil, good); return err }},
					{"allgatherv", func() error { _, err := c.PlanBuffersV(ctx, good, other, []int{32, 32}); return err }},
					{"allgatherv", func() error {
						_, err := c.PlanBuffersBlocks(ctx, other, good, []int{32, 32}, []int{0, 32})
						return err
					}},
					{"synchronize", func() error { return c.Synchronize(ctx, otherStream) }},
					{"synchronize", func() error { return c.Synchronize(ctx, nil) }},
				} {
					err := call.err()
					var oe *collective.OpError
					if !errors.Is(err, collective.ErrInvalid) || !errors.As(err, &oe) || oe.Op != call.op || oe.Rank != c.Rank() {
						return fmt.Errorf("call %d: %v, want ErrInvalid from %s on rank %d", i+1, err, call.op, c.Rank())
					}
				}
				// The communicator still works: one good plan, every rank.
				half, err := sliceOf(good, c.Rank()*32, 32)
				if err != nil {
					return err
				}
				p, err := c.PlanBuffers(ctx, good, half)
				if err != nil {
					return err
				}
				if err := p.Run(ctx); err != nil {
					return err
				}
				return p.Close()
			})
		})
	}
}

// On the CPU backend, Stream() is a stream the communicator owns: a
// failure of work on it reaches Synchronize and the next Launch as an
// *OpError wrapping it, and it is nil once the communicator is closed.
func TestBuffersCPUStream(t *testing.T) {
	var closed []*collective.Communicator
	bufferRanks(t, device.CPU, 1, 2, func(c *collective.Communicator) error {
		ctx := context.Background()
		s, ok := c.Stream().(*device.CPUStream)
		if !ok {
			return fmt.Errorf("Stream() is a %T", c.Stream())
		}
		dst, src := device.NewHostBuffer(make([]byte, 16), false), device.NewHostBuffer(make([]byte, 8), false)
		p, err := c.PlanBuffers(ctx, dst, src)
		if err != nil {
			return err
		}
		defer p.Close()
		boom := errors.New("boom")
		s.Launch(func() error { return boom })
		err = c.Synchronize(ctx, s)
		var oe *collective.OpError
		if !errors.Is(err, boom) || !errors.As(err, &oe) || oe.Rank != c.Rank() {
			return fmt.Errorf("Synchronize after failed work: %v, want an *OpError wrapping it", err)
		}
		if err := p.Launch(ctx); !errors.Is(err, boom) {
			return fmt.Errorf("Launch after failed work: %v, want it", err)
		}
		s.Reset()
		if err := p.Run(ctx); err != nil {
			return err
		}
		if c.Rank() == 0 {
			closed = append(closed, c)
		}
		return nil
	})
	for _, c := range closed {
		if c.Stream() != nil {
			t.Errorf("a closed communicator's stream is %v", c.Stream())
		}
		if c.Device().Kind() != device.CPU {
			t.Errorf("a closed communicator's device is %v", c.Device())
		}
	}
}

// On the CPU backend a host buffer over Alloc's symmetric memory is a
// source the peers read in place: PlanBuffers over it gathers every byte,
// on one node of 3 ranks and across 2 nodes of 2, and a planned Run
// allocates nothing.
func TestBuffersSymmetricCPU(t *testing.T) {
	for _, top := range []struct{ nodes, perNode int }{{1, 3}, {2, 2}} {
		t.Run(fmt.Sprintf("%dx%d", top.nodes, top.perNode), func(t *testing.T) {
			bufferRanks(t, device.CPU, top.nodes, top.perNode, func(c *collective.Communicator) error {
				ctx := context.Background()
				const n = 70_001
				P, me := c.Size(), c.Rank()
				sym, err := c.Alloc(ctx, n)
				if err != nil {
					return err
				}
				defer sym.Free()
				src := device.NewHostBuffer(sym.Bytes(), true)
				dst, err := c.Device().NewBuffer(P * n)
				if err != nil {
					return err
				}
				p, err := c.PlanBuffers(ctx, dst, src)
				if err != nil {
					return err
				}
				defer p.Close()
				host := make([]byte, P*n)
				for it := range 3 {
					pattern.Fill(sym.Bytes(), pattern.Seed(me, it, n))
					if err := p.Run(ctx); err != nil {
						return err
					}
					if err := dst.CopyOut(host); err != nil {
						return err
					}
					for r := range P {
						if i := pattern.Check(host[r*n:(r+1)*n], pattern.Seed(r, it, n)); i >= 0 {
							return fmt.Errorf("iteration %d: rank %d's block wrong at byte %d", it, r, i)
						}
					}
					// Nobody refills its source while a peer may still read it.
					if err := c.Barrier(ctx); err != nil {
						return err
					}
				}
				allocs, err := testranks.AllocsPerRun(c, func() error { return p.Run(ctx) })
				if err != nil {
					return err
				}
				if allocs >= 1 {
					return fmt.Errorf("%.1f allocations per planned run", allocs)
				}
				return nil
			})
		})
	}
}

// A block whose end (offset + size) overflows int is not in dst, and
// blocks that share bytes of dst would leave there whichever came last:
// ErrInvalid naming the rank at once, on both backends, with no
// collective call begun. Each rank's own block is good; the other rank's
// wraps, or overlaps it.
func TestBuffersBlocksOverflow(t *testing.T) {
	for _, backend := range []device.Kind{device.CPU, device.CUDA} {
		t.Run(backend.String(), func(t *testing.T) {
			bufferRanks(t, backend, 1, 2, func(c *collective.Communicator) error {
				ctx := context.Background()
				dst, err := c.Device().NewBuffer(64)
				if err != nil {
					return err
				}
				defer dst.Free()
				src, err := dst.View(32*c.Rank(), 32)
				if err != nil {
					return err
				}
				for _, bad := range [][2]int{{math.MaxInt, 16}, {1, math.MaxInt}, {math.MaxInt - 8, 16}, {32, 16}} {
					sizes, offs := make([]int, 2), make([]int, 2)
					sizes[c.Rank()], offs[c.Rank()] = 32, 32*c.Rank()
					sizes[1-c.Rank()], offs[1-c.Rank()] = bad[0], bad[1]
					_, err := c.PlanBuffersBlocks(ctx, dst, src, sizes, offs)
					var oe *collective.OpError
					if !errors.Is(err, collective.ErrInvalid) || !errors.As(err, &oe) || oe.Rank != c.Rank() {
						return fmt.Errorf("block of %d bytes at %d in 64: %v, want ErrInvalid naming rank %d", bad[0], bad[1], err, c.Rank())
					}
				}
				return nil
			})
		})
	}
}

// On the CPU backend every wait on the communicator's stream is bounded by
// Options.Timeout even when ctx has none: with work on Stream() that does
// not end, Synchronize and a plan's Run return ErrTimeout naming the rank
// (and the work goes on; once it ends, both succeed). A cancelled ctx is
// reported as such, not as a timeout. A closed plan is ErrClosed, as on
// the GPU. (The blocked work is released after a minute regardless, so
// that a wait without its bound reports instead of hanging.)
func TestBuffersCPUStreamTimeout(t *testing.T) {
	testranks.Run(t, 1, 2, func(o *collective.Options) {
		o.Backend, o.Timeout = device.CPU, 2*time.Second
	}, func(c *collective.Communicator) error {
		ctx := context.Background()
		s, ok := c.Stream().(*device.CPUStream)
		if !ok {
			return fmt.Errorf("Stream() is a %T", c.Stream())
		}
		dst, src := device.NewHostBuffer(make([]byte, 16), false), device.NewHostBuffer(make([]byte, 8), false)
		p, err := c.PlanBuffers(ctx, dst, src)
		if err != nil {
			return err
		}
		release := make(chan struct{})
		var once sync.Once
		free := func() { once.Do(func() { close(release) }) }
		defer free()
		stop := time.AfterFunc(time.Minute, free)
		defer stop.Stop()
		s.Launch(func() error { <-release; return nil })
		timedOut := func(what, op string, err error) error {
			var oe *collective.OpError
			if !errors.Is(err, collective.ErrTimeout) || !errors.As(err, &oe) || oe.Rank != c.Rank() || oe.Op != op {
				return fmt.Errorf("%s over work that does not end: %v, want ErrTimeout from %s naming rank %d", what, err, op, c.Rank())
			}
			return nil
		}
		if err := timedOut("Synchronize", "synchronize", c.Synchronize(ctx, s)); err != nil {
			return err
		}
		if err := timedOut("Plan.Run", "allgather", p.Run(ctx)); err != nil {
			return err
		}
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		for what, err := range map[string]error{"Synchronize": c.Synchronize(cctx, s), "Plan.Launch": p.Launch(cctx)} {
			if !errors.Is(err, context.Canceled) || errors.Is(err, collective.ErrTimeout) {
				return fmt.Errorf("%s with a cancelled context: %v, want context.Canceled (not ErrTimeout)", what, err)
			}
		}
		free()
		if err := c.Synchronize(ctx, s); err != nil {
			return err
		}
		if err := p.Run(ctx); err != nil {
			return err
		}
		if err := p.Close(); err != nil {
			return err
		}
		if err := p.Run(ctx); !errors.Is(err, collective.ErrClosed) {
			return fmt.Errorf("Run of a closed plan: %v, want ErrClosed", err)
		}
		return nil
	})
}
