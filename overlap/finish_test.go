package overlap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/testranks"
)

// wayOf names one of an Op's ways of running.
type wayOf struct {
	name string
	f    func(*Op[float32]) func(context.Context) error
	f64  func(*Op[float64]) func(context.Context) error
}

var ways = []wayOf{
	{"Run", (*Op[float32]).runWay, (*Op[float64]).runWay},
	{"RunSequential", (*Op[float32]).sequentialWay, (*Op[float64]).sequentialWay},
	{"GEMM", (*Op[float32]).gemmWay, (*Op[float64]).gemmWay},
}

func (o *Op[T]) runWay() func(context.Context) error        { return o.Run }
func (o *Op[T]) sequentialWay() func(context.Context) error { return o.RunSequential }
func (o *Op[T]) gemmWay() func(context.Context) error       { return o.GEMM }

// TestFailedRunLeavesC: a run that returns an error (here rank 0's
// context is cancelled before it starts) has finished writing C when it
// returns: its GEMMs already enqueued are waited for (within a bound), so
// that C, random data multiplied, stays the same byte for byte afterwards
// (run with -race: a GEMM still writing C is a race with ReadC).
func TestFailedRunLeavesC(t *testing.T) {
	const m, n, k = 384, 256, 256
	for _, kind := range []device.Kind{device.CPU, device.CUDA} {
		for _, way := range ways {
			t.Run(fmt.Sprintf("%v/%s", kind, way.name), func(t *testing.T) {
				testranks.Run(t, 1, 2, func(o *collective.Options) {
					o.Backend, o.Timeout, o.GPUScratch = kind, 2*time.Second, 64<<10
				}, func(c *collective.Communicator) error {
					o, err := New[float32](context.Background(), c, m, n, k, 4)
					if err != nil {
						return err
					}
					defer o.Close()
					a, b := make([]float32, m*k), make([]float32, k*n)
					fillRand(a, uint64(c.Rank()+1))
					fillRand(b, 9)
					if err := o.WriteA(a); err != nil {
						return err
					}
					if err := o.WriteB(b); err != nil {
						return err
					}
					ctx := context.Background()
					if c.Rank() == 0 {
						cctx, cancel := context.WithCancel(ctx)
						cancel()
						ctx = cctx
					}
					err = way.f(o)(ctx)
					if c.Rank() != 0 {
						return nil // its run may fail with rank 0's: not the point
					}
					if !errors.Is(err, context.Canceled) {
						return fmt.Errorf("%s with a cancelled context: %v, want context.Canceled", way.name, err)
					}
					got := make([]float32, 2*m*n)
					if err := o.ReadC(got); err != nil {
						return err
					}
					snap := bytes.Clone(asBytes(got))
					time.Sleep(300 * time.Millisecond)
					if err := o.ReadC(got); err != nil {
						return err
					}
					if !bytes.Equal(asBytes(got), snap) {
						return fmt.Errorf("%s returned %q, yet C changed afterwards: its GEMMs were still running", way.name, err)
					}
					return nil
				})
			})
		}
	}
}

// TestSlowGEMMIsNoPeerTimeout: the communicator's timeout bounds the waits
// for peers (the gather's), not the local GEMMs: a run whose GEMMs take
// far longer succeeds, C bit for bit that of an all-gather then one GEMM,
// random data. A run whose GEMMs outlast Options.ComputeTimeout is
// ErrComputeTimeout naming the rank and no peer, not ErrTimeout; the
// communicator is not broken by it (a barrier succeeds), and once the GEMMs
// are done the Op reads the complete C. On the CPU only: the CUDA
// emulator multiplies at the launch, so that no wait ever finds a GEMM
// running.
func TestSlowGEMMIsNoPeerTimeout(t *testing.T) {
	const m, n, k = 1280, 768, 768 // float64: about a second per rank here
	for _, kind := range []device.Kind{device.CPU} {
		for _, way := range ways {
			for _, computeTimeout := range []time.Duration{0, time.Millisecond} {
				t.Run(fmt.Sprintf("%v/%s/compute%v", kind, way.name, computeTimeout), func(t *testing.T) {
					// Long enough for Init and for a gather that shares the
					// processors with the GEMMs on a busy machine; the GEMMs
					// are made far longer below.
					const timeout = 2 * time.Second
					// The ranks finish their GEMMs at different times, further
					// apart than the peer timeout: they line up in this
					// process before each collective that follows.
					beforeRun, beforeBarrier := newLineUp(2), newLineUp(2)
					testranks.Run(t, 1, 2, func(o *collective.Options) {
						o.Backend, o.Timeout, o.GPUScratch = kind, timeout, 64<<10
					}, func(c *collective.Communicator) error {
						ctx := context.Background()
						o, err := NewWith[float64](ctx, c, m, n, k, Options{Pieces: 2, MinPieceBytes: -1, ComputeTimeout: computeTimeout})
						if err != nil {
							return err
						}
						defer o.Close()
						a, b := make([]float64, m*k), make([]float64, k*n)
						fillRand(a, uint64(c.Rank()*1000+3))
						fillRand(b, 5)
						if err := o.WriteA(a); err != nil {
							return err
						}
						if err := o.WriteB(b); err != nil {
							return err
						}
						if err := o.Gather(ctx); err != nil { // G, for GEMM alone
							return err
						}
						g := make([]float64, 2*m*k)
						if err := o.ReadG(g); err != nil {
							return err
						}
						t0 := time.Now()
						want := asBytes(Multiply(g, b, 2*m, n, k))
						ref := time.Since(t0)
						t0 = time.Now()
						Multiply(g, b, 2*m, n, k)
						ref = min(ref, time.Since(t0))
						if computeTimeout == 0 {
							// The run's GEMMs, each repeated (C is
							// overwritten alike; mul enqueues them on
							// the stream), take about three peer
							// timeouts at least: twice as many as the
							// faster of two reference GEMMs, here and
							// now, takes to last that long, for a load
							// that drops before the run. (With a peer
							// timeout of a fraction of one GEMM, a
							// gather that the GEMMs kept from the
							// processors timed out on a loaded
							// machine; with a count from one reference
							// GEMM alone, measured under a load that
							// then dropped, the run lasted little more
							// than a timeout and tested nothing.)
							reps := min(64, int(6*timeout/max(ref, time.Millisecond))+1)
							mul := o.eng.mul
							o.eng.mul = func(s device.Stream, m, n, k int, a, b, c device.Buffer) error {
								for range reps - 1 {
									if err := mul(s, m, n, k, a, b, c); err != nil {
										return err
									}
								}
								return mul(s, m, n, k, a, b, c)
							}
						}
						if err := beforeRun.meet(); err != nil {
							return err
						}
						// Each wait for the GEMMs lasts up to ComputeTimeout:
						// a run that passed it waits no more.
						waits := &countingSync{s: o.eng.computeSync}
						o.eng.computeSync = waits
						start := time.Now()
						err = way.f64(o)(ctx)
						took := time.Since(start)
						t.Logf("rank %d: %s took %v: %v", c.Rank(), way.name, took.Round(time.Millisecond), err)
						if n := waits.n.Load(); computeTimeout > 0 && n != 1 {
							t.Errorf("rank %d: %s waited for its GEMMs %d times (each up to ComputeTimeout), want once", c.Rank(), way.name, n)
						}
						if computeTimeout == 0 && err != nil {
							return fmt.Errorf("%s whose GEMMs took %v, under a %v peer timeout: %w", way.name, took.Round(time.Millisecond), timeout, err)
						}
						if computeTimeout == 0 && took < 2*timeout {
							return fmt.Errorf("%s took %v, not far longer than the %v peer timeout: the run tests nothing", way.name, took.Round(time.Millisecond), timeout)
						}
						if computeTimeout > 0 {
							var oe *collective.OpError
							if !errors.Is(err, ErrComputeTimeout) || errors.Is(err, collective.ErrTimeout) || !errors.As(err, &oe) || oe.Rank != c.Rank() || oe.Peer != -1 {
								return fmt.Errorf("%s under a %v compute timeout, GEMMs of %v: %v, want ErrComputeTimeout naming rank %d, no peer", way.name, computeTimeout, took.Round(time.Millisecond), err, c.Rank())
							}
						}
						got := make([]float64, 2*m*n)
						deadline := time.Now().Add(30 * time.Second)
						for err = o.ReadC(got); errors.Is(err, ErrComputeTimeout) && time.Now().Before(deadline); err = o.ReadC(got) {
							time.Sleep(20 * time.Millisecond) // the GEMMs still run
						}
						if err != nil {
							return err
						}
						if !bytes.Equal(asBytes(got), want) {
							return fmt.Errorf("%s: C differs from one GEMM of the gathered A", way.name)
						}
						if err := beforeBarrier.meet(); err != nil {
							return err
						}
						return c.Barrier(ctx)
					})
				})
			}
		}
	}
}

// lineUp lines up the ranks of one process: each meet returns once P
// ranks have called it, or after 30 s.
type lineUp struct {
	left atomic.Int32
	all  chan struct{}
}

func newLineUp(P int) *lineUp {
	l := &lineUp{all: make(chan struct{})}
	l.left.Store(int32(P))
	return l
}

func (l *lineUp) meet() error {
	if l.left.Add(-1) == 0 {
		close(l.all)
	}
	select {
	case <-l.all:
		return nil
	case <-time.After(30 * time.Second):
		return errors.New("the other ranks did not line up within 30 s")
	}
}

// countingSync counts the engine's waits for its compute stream.
type countingSync struct {
	s interface {
		SynchronizeBy(context.Context, time.Time) error
	}
	n atomic.Int32
}

func (c *countingSync) SynchronizeBy(ctx context.Context, d time.Time) error {
	c.n.Add(1)
	return c.s.SynchronizeBy(ctx, d)
}
