package overlap

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/device"
)

// engine runs an Op on the communicator's device, whichever backend it is,
// through the device interfaces alone. The gather is the communicator's:
// one plan of the device's buffers per piece (PlanBuffersBlocks), each
// launched in order on the communicator's stream (comm) and followed by an
// event; the GEMMs run on a compute stream of the same device, this
// rank's own rows at once and each piece's rows once its event is reached.
// The compute stream forks off comm at the start of a run; the end of a
// run waits for comm (the communicator's Synchronize: the gather, bounded
// by the communicator's timeout), then for the compute stream (the GEMMs,
// which wait on no peer, bounded by Options.ComputeTimeout), and only then
// joins the compute stream into comm, so that comm's later work is ordered
// after the run. A run that fails waits for both all the same (finish).
//
// On the GPU the launches enqueue kernels and the host returns at once; on
// the CPU a launch gathers on the calling goroutine while the compute
// stream's goroutine multiplies the pieces already gathered. Everything a
// run uses (plans, events, views of the matrices for every task) is made
// here, so that a run allocates nothing.
type engine struct {
	c             *collective.Communicator
	comm, compute device.Stream // comm is the communicator's
	fork, join    device.Event
	events        []device.Event // one per piece
	gemm          device.GEMM
	mul           func(s device.Stream, m, n, k int, a, b, c device.Buffer) error // gemm's F32 or F64
	mats          [4]device.Buffer                                                // A, B, C, G
	plans         []*collective.Plan                                              // one per piece
	tasks         []gemmTask
	n, k          int    // B's dimensions
	fallback      string // the mode without plans
	// computeSync waits for the compute stream up to a deadline (both
	// backends' streams have it), within computeTimeout
	// (Options.ComputeTimeout): the GEMMs wait for no peer, so the
	// communicator's timeout does not bound them.
	computeSync interface {
		SynchronizeBy(context.Context, time.Time) error
	}
	computeTimeout time.Duration
	// pending is set where a wait for the GEMMs gave up: they may still
	// write C. Every later call waits for them first (settle).
	pending bool
}

// The matrices' places in engine.mats.
const (
	matA = iota // this rank's m × k rows
	matB        // k × n
	matC        // (P·m) × n
	matG        // the gathered A, (P·m) × k
)

// shape is an Op's dimensions and element size.
type shape struct{ P, me, m, n, k, esz int }

// gemmTask is a Task with its operands: the rows of A (own rows) or G it
// multiplies in a run, the same rows of G (for GEMM alone, after a
// gather), and the rows of C it writes.
type gemmTask struct {
	piece, rows int
	a, g, c     device.Buffer
}

func newEngine(ctx context.Context, c *collective.Communicator, sh shape, pieces []Piece, tasks []Task, computeTimeout time.Duration) (_ *engine, err error) {
	dev, comm := c.Device(), c.Stream()
	if comm == nil {
		return nil, &collective.OpError{Op: "overlap", Rank: c.Rank(), Peer: -1, Err: collective.ErrClosed, Detail: "the communicator is closed"}
	}
	e := &engine{c: c, comm: comm, n: sh.n, k: sh.k, fallback: "host", computeTimeout: computeTimeout}
	if dev.Kind() == device.CUDA {
		e.fallback = "graph"
		if c.Options().Eager {
			e.fallback = "eager"
		}
	}
	defer func() {
		if err != nil {
			e.close()
			err = e.named("overlap-plan", err)
		}
	}()
	P, m, n, k, esz := sh.P, sh.m, sh.n, sh.k, sh.esz
	for i, bytes := range [...]int{matA: m * k * esz, matB: k * n * esz, matC: P * m * n * esz, matG: P * m * k * esz} {
		if e.mats[i], err = dev.NewBuffer(bytes); err != nil {
			return nil, err
		}
	}
	A, G, C := e.mats[matA], e.mats[matG], e.mats[matC]
	if e.compute, err = dev.NewStream(); err != nil {
		return nil, err
	}
	var ok bool
	if e.computeSync, ok = e.compute.(interface {
		SynchronizeBy(context.Context, time.Time) error
	}); !ok {
		return nil, fmt.Errorf("overlap: a %T has no bounded wait: %w", e.compute, collective.ErrInvalid)
	}
	if e.gemm, err = dev.NewGEMM(); err != nil {
		return nil, err
	}
	e.mul = e.gemm.F32
	if esz == 8 {
		e.mul = e.gemm.F64
	}
	for _, ev := range []*device.Event{&e.fork, &e.join} {
		if *ev, err = dev.NewEvent(); err != nil {
			return nil, err
		}
	}
	for _, t := range tasks {
		rows := t.Hi - t.Lo
		gt := gemmTask{piece: t.Piece, rows: rows}
		if rows > 0 && n > 0 {
			row := t.Rank*m + t.Lo
			if gt.g, err = G.View(row*k*esz, rows*k*esz); err != nil {
				return nil, err
			}
			gt.a = gt.g
			if t.Rank == sh.me {
				if gt.a, err = A.View(t.Lo*k*esz, rows*k*esz); err != nil {
					return nil, err
				}
			}
			if gt.c, err = C.View(row*n*esz, rows*n*esz); err != nil {
				return nil, err
			}
		}
		e.tasks = append(e.tasks, gt)
	}
	if dev.Kind() == device.CUDA {
		if err = e.warm(ctx); err != nil {
			return nil, err
		}
	}
	for _, p := range pieces {
		ev, err := dev.NewEvent()
		if err != nil {
			return nil, err
		}
		e.events = append(e.events, ev)
		src, err := A.View(p.Lo*k*esz, (p.Hi-p.Lo)*k*esz)
		if err != nil {
			return nil, err
		}
		sizes, offs := make([]int, P), make([]int, P)
		for r := range P { // rank r's rows of the piece, at their place in r's block
			sizes[r] = (p.Hi - p.Lo) * k * esz
			offs[r] = (r*m + p.Lo) * k * esz
		}
		plan, err := c.PlanBuffersBlocks(ctx, G, src, sizes, offs)
		if err != nil {
			return nil, err
		}
		e.plans = append(e.plans, plan)
	}
	return e, nil
}

// warm runs, once, each distinct GEMM the plan's tasks will run, and
// waits for it, before the plans' barrier: under CUDA's lazy module
// loading a kernel's first launch waits for every stream of the device,
// and cuBLAS picks its kernels by element type, shape and the operands'
// alignment, loading each at its first use. One that first came in a run,
// while a node peer sharing the GPU already spins in its all-gather
// waiting for this rank, would stall both until the kernel's timeout. So
// warm runs each task's own call (the rows of A or G it multiplies, both
// for this rank's own rows, B, and its rows of C) on the compute stream,
// once per distinct key of rows and the operands' addresses mod 256 (n, k
// and the element type are the engine's): their contents are whatever
// they hold, and every run overwrites C.
func (e *engine) warm(ctx context.Context) error {
	type key struct {
		rows    int
		a, b, c uint64
	}
	seen := map[key]bool{}
	B := e.mats[matB]
	for i := range e.tasks {
		t := &e.tasks[i]
		if t.c == nil {
			continue // no rows, or no columns: no GEMM is launched
		}
		for _, a := range [...]device.Buffer{t.a, t.g} {
			k := key{t.rows, align(a), align(B), align(t.c)}
			if seen[k] {
				continue
			}
			seen[k] = true
			if err := e.mul(e.compute, t.rows, e.n, e.k, a, B, t.c); err != nil {
				return err
			}
		}
	}
	return e.compute.Synchronize(ctx)
}

// align is b's device address mod 256 (0 for a buffer of another kind).
func align(b device.Buffer) uint64 {
	if cb, ok := b.(*device.CUDABuffer); ok {
		return uint64(cb.Ptr) % 256
	}
	return 0
}

// named returns err as an *collective.OpError naming op and this rank,
// unless it is one already (the collective's errors name their rank and
// peer): a device's error (a failed allocation, enqueue or GEMM) says
// which rank's operator met it.
func (e *engine) named(op string, err error) error {
	var oe *collective.OpError
	if errors.As(err, &oe) {
		return err
	}
	return &collective.OpError{Op: op, Rank: e.c.Rank(), Peer: -1, Err: err, Detail: "the overlap Op's device work failed"}
}

func (e *engine) mode() string {
	if len(e.plans) > 0 {
		return e.plans[0].Mode()
	}
	return e.fallback
}

// launchTask enqueues task t's rows of C on the compute stream, from A
// for this rank's own rows (unless fromG) and from G for the others'.
func (e *engine) launchTask(t *gemmTask, fromG bool) error {
	if t.c == nil {
		return nil // no rows, or no columns
	}
	a := t.a
	if fromG {
		a = t.g
	}
	return e.mul(e.compute, t.rows, e.n, e.k, a, e.mats[matB], t.c)
}

// forkCompute orders the compute stream's next work after what comm
// holds now.
func (e *engine) forkCompute() error {
	if err := e.fork.Record(e.comm); err != nil {
		return err
	}
	return e.compute.Wait(e.fork)
}

// finish ends a run: it waits for the gather (the communicator's
// Synchronize of comm: within the communicator's timeout, reporting what
// the kernels saw), then for the GEMMs (the compute stream, within
// computeTimeout: a slow GEMM is no peer's timeout and breaks nothing),
// joins the compute stream into comm, and collects each plan's outcome;
// err, an error of the launches, comes first. comm holds no work of the
// compute stream until the join, so the first wait is the gather's alone.
// On any error, ctx's cancellation included, it drains the streams before
// it returns. The success path allocates nothing.
func (e *engine) finish(ctx context.Context, err error) error {
	if err == nil && ctx.Err() != nil {
		// Ended: the run returns ctx's error, once drained. A wait with
		// it would give up at once, and on the GPU break the path.
		err = &collective.OpError{Op: "allgather-gemm", Rank: e.c.Rank(), Peer: -1, Err: ctx.Err(), Detail: "the run's context ended; what it had enqueued was waited for"}
	}
	if err == nil {
		err = e.c.Synchronize(ctx, e.comm)
	}
	if err == nil {
		err = e.waitCompute(ctx)
	}
	if err != nil {
		return e.drain(ctx, err)
	}
	// The GEMMs are done: comm's wait for them is over at once.
	if err := e.joinCompute(); err != nil {
		return e.named("allgather-gemm", err)
	}
	for _, p := range e.plans {
		if err := p.Check(ctx); err != nil {
			return err
		}
	}
	return nil
}

// drain is finish's error path: whatever ended the run (ctx may be
// cancelled), it waits for what the run enqueued, with ctx's values but
// not its cancellation: the gather within the communicator's timeout (its
// Synchronize's bound), the GEMMs within computeTimeout, so that nothing
// writes C or G once the run has returned. Where the GEMMs outlast that,
// pending stays set for the next call, and the compute stream is not
// joined into comm: comm's wait for it would be bounded by the
// communicator's timeout, and fail comm (and the compute stream's waits
// on comm's events after it) while the GEMMs merely run long; settle joins
// it once they are done. It returns err, named.
func (e *engine) drain(ctx context.Context, err error) error {
	ctx = context.WithoutCancel(ctx)
	// The run's error comes first: the gather's wait fails only where the
	// run failed already (and a GPU path it breaks stays broken, for every
	// later call to report), and the join only where the stream did.
	_ = e.c.Synchronize(ctx, e.comm)
	if !errors.Is(err, ErrComputeTimeout) { // a wait that passed the bound is not made again
		cerr := e.waitCompute(ctx)
		if errors.Is(cerr, ErrComputeTimeout) {
			// That its GEMMs still run is said too.
			err = fmt.Errorf("%w (and %w)", err, cerr)
		}
	}
	if !e.pending {
		_ = e.joinCompute()
	}
	return e.named("allgather-gemm", err)
}

// waitCompute waits for the GEMMs enqueued on the compute stream, within
// computeTimeout: ErrComputeTimeout naming this rank (no peer) where they
// are not done by then, pending set; ctx's error where ctx ended first;
// the GEMMs' own failure otherwise. It allocates nothing unless it fails.
func (e *engine) waitCompute(ctx context.Context) error {
	err := e.computeSync.SynchronizeBy(ctx, time.Now().Add(e.computeTimeout))
	switch {
	case err == nil:
		e.pending = false
		return nil
	case ctx.Err() != nil:
		// A CUDA stream's wait reports ctx's end as ErrWaitTimeout too.
		e.pending = true
		return &collective.OpError{Op: "allgather-gemm", Rank: e.c.Rank(), Peer: -1, Err: ctx.Err(), Detail: "waiting for the GEMMs"}
	case errors.Is(err, device.ErrWaitTimeout):
		e.pending = true
		return &collective.OpError{Op: "allgather-gemm", Rank: e.c.Rank(), Peer: -1, Err: fmt.Errorf("%w: %w", ErrComputeTimeout, err),
			Detail: fmt.Sprintf("this rank's GEMMs were not done within %v (Options.ComputeTimeout)", e.computeTimeout)}
	}
	e.pending = false // failed, not running
	return e.named("allgather-gemm", err)
}

// joinCompute orders comm's later work after the compute stream's.
func (e *engine) joinCompute() error {
	if err := e.join.Record(e.compute); err != nil {
		return err
	}
	return e.comm.Wait(e.join)
}

// settle is nil unless GEMMs of an earlier run may still be running (a
// wait for them gave up): then it waits for them, within computeTimeout,
// and returns ErrComputeTimeout where they still run, so that no call
// touches the matrices under them. One bool read when nothing is pending.
func (e *engine) settle(op string) error {
	if !e.pending {
		return nil
	}
	if err := e.waitCompute(context.Background()); err != nil {
		var oe *collective.OpError
		if errors.As(err, &oe) {
			oe.Op = op
		}
		return err
	}
	if err := e.joinCompute(); err != nil { // as drain left it undone
		return e.named(op, err)
	}
	return nil
}

// usable is nil while the communicator's stream is the one the engine
// kept (comm), and ErrClosed naming the rank once the communicator is
// closed (its stream closed with it, a CUDA stream's handle destroyed):
// every run asks first, so that nothing is recorded on a closed stream.
// It compares two interface values: no allocation, no lock.
func (e *engine) usable(op string) error {
	if e.c.Stream() != e.comm {
		return &collective.OpError{Op: op, Rank: e.c.Rank(), Peer: -1, Err: collective.ErrClosed, Detail: "the communicator is closed"}
	}
	return nil
}

func (e *engine) run(ctx context.Context) error {
	if err := e.usable("allgather-gemm"); err != nil {
		return err
	}
	if err := e.settle("allgather-gemm"); err != nil {
		return err
	}
	if err := e.forkCompute(); err != nil {
		return e.finish(ctx, err)
	}
	tasks, i := e.tasks, 0
	for ; i < len(tasks) && tasks[i].piece < 0; i++ {
		if err := e.launchTask(&tasks[i], false); err != nil {
			return e.finish(ctx, err)
		}
	}
	for p, plan := range e.plans {
		if err := plan.Launch(ctx); err != nil {
			return e.finish(ctx, err)
		}
		if err := e.events[p].Record(e.comm); err != nil {
			return e.finish(ctx, err)
		}
		if err := e.compute.Wait(e.events[p]); err != nil {
			return e.finish(ctx, err)
		}
		for ; i < len(tasks) && tasks[i].piece == p; i++ {
			if err := e.launchTask(&tasks[i], false); err != nil {
				return e.finish(ctx, err)
			}
		}
	}
	return e.finish(ctx, nil)
}

func (e *engine) launchGather(ctx context.Context) error {
	for _, plan := range e.plans {
		if err := plan.Launch(ctx); err != nil {
			return err
		}
	}
	return nil
}

// launchGEMMs enqueues every GEMM on the compute stream, all rows from G,
// after what comm holds.
func (e *engine) launchGEMMs() error {
	if err := e.forkCompute(); err != nil {
		return err
	}
	for i := range e.tasks {
		if err := e.launchTask(&e.tasks[i], true); err != nil {
			return err
		}
	}
	return nil
}

func (e *engine) sequential(ctx context.Context) error {
	if err := e.usable("allgather-gemm"); err != nil {
		return err
	}
	if err := e.settle("allgather-gemm"); err != nil {
		return err
	}
	err := e.launchGather(ctx)
	if err == nil {
		err = e.launchGEMMs()
	}
	return e.finish(ctx, err)
}

func (e *engine) gather(ctx context.Context) error {
	if err := e.usable("allgather-gemm"); err != nil {
		return err
	}
	if err := e.settle("allgather-gemm"); err != nil {
		return err
	}
	return e.finish(ctx, e.launchGather(ctx))
}

func (e *engine) gemmOnly(ctx context.Context) error {
	if err := e.usable("allgather-gemm"); err != nil {
		return err
	}
	if err := e.settle("allgather-gemm"); err != nil {
		return err
	}
	return e.finish(ctx, e.launchGEMMs())
}

// close releases the plans (a collective call on the GPU), then the
// streams, events and GEMM, then the matrices, which no plan reads any
// more.
func (e *engine) close() error {
	var errs []error
	// GEMMs of a run that timed out may still write the matrices: wait for
	// them (within computeTimeout); where they still run, the compute
	// stream, its GEMM and the matrices are left to them, not freed.
	running := e.settle("overlap-close")
	for _, p := range e.plans {
		errs = append(errs, p.Close())
	}
	e.plans = nil
	if running != nil {
		return errors.Join(append(errs, running)...)
	}
	if e.compute != nil {
		// Nothing is in flight between runs; a failed New may have
		// enqueued nothing at all.
		errs = append(errs, e.compute.Close())
	}
	for _, ev := range append([]device.Event{e.fork, e.join}, e.events...) {
		if c, ok := ev.(interface{ Close() error }); ok && ev != nil {
			errs = append(errs, c.Close())
		}
	}
	if e.gemm != nil {
		errs = append(errs, e.gemm.Close())
	}
	for _, b := range e.mats {
		if b != nil {
			errs = append(errs, b.Free())
		}
	}
	return errors.Join(errs...)
}
