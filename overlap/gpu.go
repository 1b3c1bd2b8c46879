package overlap

import (
	"context"
	"errors"
	"fmt"
	"unsafe"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/cudagraph"
	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/intra"
	"github.com/slimego/slimego/kernels"
)

// GPUOp is the overlapped C = AllGather(A)·B on the CUDA backend, with the
// schedule of Op (Pieces, Tasks): each rank's A lives in node-symmetric
// device memory; the comm stream waits at a flag barrier until every rank's
// A is written, then pulls the other ranks' rows piece by piece with the
// copy engines (cudaMemcpyAsync from the peers' mapped memory), recording
// an event per copy; the compute stream runs cuBLAS on this rank's own rows
// at once and on each other piece once its event is reached; a second
// barrier keeps every rank's A unchanged until all have read it. Each of
// the four ways (Run, RunSequential, Gather, GEMM) is captured into a CUDA
// graph on its first run unless the communicator is in eager mode.
//
// Write A (m × k, row-major) and B (k × n) with CopyFromHost before Run; C
// ((P·m) × n) and G (the gathered A) are device buffers too. One node only.
type GPUOp[T Float] struct {
	A    *device.CUDABuffer // this rank's rows: the node-symmetric allocation
	B, C *device.CUDABuffer
	G    *device.CUDABuffer // gathered A, (P·m) × k

	c             *collective.Communicator
	gpu           *device.GPU
	lib           *kernels.Lib
	sym           *intra.GPUSymmetric
	P, me         int
	m, n, k, esz  int
	tasks         []Task
	comm, compute *device.CUDAStream
	fork, join    *device.CUDAEvent
	events        []*device.CUDAEvent // one per task
	blas          kernels.Blas
	barrier       *kernels.BarrierArgs
	run, seq      *cudagraph.Runner
	gather, gemm  *cudagraph.Runner
}

// NewGPU plans a GPUOp on c's GPU (a collective call): m × k rows of A per
// rank, B of k × n, the gather cut into the given number of pieces.
func NewGPU[T Float](ctx context.Context, c *collective.Communicator, m, n, k, pieces int) (o *GPUOp[T], err error) {
	if m < 0 || n < 0 || k < 0 {
		return nil, fmt.Errorf("overlap: negative shape %d×%d×%d: %w", m, n, k, collective.ErrInvalid)
	}
	gpu := c.GPU()
	if gpu == nil {
		return nil, fmt.Errorf("overlap: the communicator has no GPU: %w", collective.ErrInvalid)
	}
	var z T
	o = &GPUOp[T]{c: c, gpu: gpu, lib: gpu.Lib(), P: c.Size(), me: c.Rank(), m: m, n: n, k: k, esz: int(unsafe.Sizeof(z))}
	defer func() {
		if err != nil {
			o.Close()
		}
	}()
	if o.barrier, err = c.GPUBarrierArgs(); err != nil {
		return nil, err
	}
	if o.sym, err = c.AllocGPUSymmetric(ctx, max(m*k*o.esz, 1)); err != nil {
		return nil, err
	}
	o.A = &device.CUDABuffer{Dev: gpu, Ptr: o.sym.Local(), Len: m * k * o.esz}
	for _, b := range []struct {
		dst   **device.CUDABuffer
		bytes int
	}{{&o.B, k * n * o.esz}, {&o.C, o.P * m * n * o.esz}, {&o.G, o.P * m * k * o.esz}} {
		if *b.dst, err = gpu.Alloc(b.bytes); err != nil {
			return nil, err
		}
	}
	if o.comm, err = gpu.NewStream(); err != nil {
		return nil, err
	}
	if o.compute, err = gpu.NewStream(); err != nil {
		return nil, err
	}
	if o.blas, err = o.lib.BlasCreate(gpu.Ordinal); err != nil {
		return nil, err
	}
	ps := Pieces(m, max(pieces, 1))
	o.tasks = Tasks(o.P, o.me, m, ps)
	for _, ev := range []**device.CUDAEvent{&o.fork, &o.join} {
		if *ev, err = gpu.NewEvent(false); err != nil {
			return nil, err
		}
	}
	o.events = make([]*device.CUDAEvent, len(o.tasks))
	for i := range o.events {
		if o.events[i], err = gpu.NewEvent(false); err != nil {
			return nil, err
		}
	}
	eager := c.Options().Eager || cudagraph.Eager()
	o.run = cudagraph.New(o.comm, eager, o.launchOverlap)
	o.seq = cudagraph.New(o.comm, eager, o.launchSequential)
	o.gather = cudagraph.New(o.comm, eager, o.launchGather)
	o.gemm = cudagraph.New(o.comm, eager, o.launchGEMMs)
	// No rank runs before every rank has mapped the others' A.
	if err := c.Barrier(ctx); err != nil {
		return nil, err
	}
	return o, nil
}

// Mode is "graph" or "eager".
func (o *GPUOp[T]) Mode() string { return o.run.Mode() }

// copyTask pulls task t's rows of another rank's A into G on s.
func (o *GPUOp[T]) copyTask(t Task, s *device.CUDAStream) error {
	rows := t.Hi - t.Lo
	if rows == 0 || o.k == 0 {
		return nil
	}
	src := o.sym.Peers[t.Rank] + kernels.Ptr(t.Lo*o.k*o.esz)
	dst := o.G.Ptr + kernels.Ptr((t.Rank*o.m+t.Lo)*o.k*o.esz)
	return o.lib.MemcpyAsync(o.gpu.Ordinal, dst, src, uint64(rows*o.k*o.esz), s.H)
}

// gemmTask computes task t's rows of C on s: from A for this rank's rows,
// from G for the others'.
func (o *GPUOp[T]) gemmTask(t Task, s *device.CUDAStream, fromG bool) error {
	rows := t.Hi - t.Lo
	if rows == 0 || o.n == 0 {
		return nil
	}
	cRows := o.C.Ptr + kernels.Ptr((t.Rank*o.m+t.Lo)*o.n*o.esz)
	if o.k == 0 {
		return o.lib.MemsetAsync(o.gpu.Ordinal, cRows, 0, uint64(rows*o.n*o.esz), s.H)
	}
	a := o.G.Ptr + kernels.Ptr((t.Rank*o.m+t.Lo)*o.k*o.esz)
	if t.Rank == o.me && !fromG {
		a = o.A.Ptr + kernels.Ptr(t.Lo*o.k*o.esz)
	}
	if o.esz == 4 {
		return o.lib.GemmF32(o.gpu.Ordinal, o.blas, s.H, rows, o.n, o.k, a, o.k, o.B.Ptr, o.n, cRows, o.n)
	}
	return o.lib.GemmF64(o.gpu.Ordinal, o.blas, s.H, rows, o.n, o.k, a, o.k, o.B.Ptr, o.n, cRows, o.n)
}

// launchGather enqueues the whole gather on s: barrier, the own rows and
// every other rank's rows into G, barrier.
func (o *GPUOp[T]) launchGather(s *device.CUDAStream) error {
	if err := o.lib.Barrier(o.gpu.Ordinal, o.barrier, s.H); err != nil {
		return err
	}
	own := Task{Rank: o.me, Lo: 0, Hi: o.m}
	if err := o.copyTask(own, s); err != nil {
		return err
	}
	for _, t := range o.tasks {
		if t.Rank != o.me {
			if err := o.copyTask(t, s); err != nil {
				return err
			}
		}
	}
	return o.lib.Barrier(o.gpu.Ordinal, o.barrier, s.H)
}

// launchGEMMs enqueues every GEMM on s, all rows from G.
func (o *GPUOp[T]) launchGEMMs(s *device.CUDAStream) error {
	for _, t := range o.tasks {
		if err := o.gemmTask(t, s, true); err != nil {
			return err
		}
	}
	return nil
}

func (o *GPUOp[T]) launchSequential(s *device.CUDAStream) error {
	if err := o.launchGather(s); err != nil {
		return err
	}
	return o.launchGEMMs(s)
}

// launchOverlap forks the compute stream off s, pulls piece by piece on s
// with an event per copy, runs each GEMM on the compute stream after its
// copy's event, and joins the compute stream back into s.
func (o *GPUOp[T]) launchOverlap(s *device.CUDAStream) error {
	dev := o.gpu.Ordinal
	steps := []func() error{
		func() error { return o.fork.Record(s) },
		func() error { return o.compute.Wait(o.fork) },
		func() error { return o.lib.Barrier(dev, o.barrier, s.H) },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	for i, t := range o.tasks {
		if t.Rank != o.me {
			if err := o.copyTask(t, s); err != nil {
				return err
			}
			if err := o.events[i].Record(s); err != nil {
				return err
			}
			if err := o.compute.Wait(o.events[i]); err != nil {
				return err
			}
		}
		if err := o.gemmTask(t, o.compute, false); err != nil {
			return err
		}
	}
	// G's own rows, for completeness, and the barrier that frees A.
	if err := o.copyTask(Task{Rank: o.me, Lo: 0, Hi: o.m}, s); err != nil {
		return err
	}
	if err := o.lib.Barrier(dev, o.barrier, s.H); err != nil {
		return err
	}
	if err := o.join.Record(o.compute); err != nil {
		return err
	}
	return s.Wait(o.join)
}

func (o *GPUOp[T]) do(ctx context.Context, r *cudagraph.Runner) error {
	if err := r.Run(); err != nil {
		return fmt.Errorf("overlap: rank %d: %w", o.me, err)
	}
	return o.c.SyncGPU(ctx, "allgather-gemm", o.comm)
}

// Run computes C, overlapped.
func (o *GPUOp[T]) Run(ctx context.Context) error { return o.do(ctx, o.run) }

// RunSequential gathers all of A, then computes C (t_seq).
func (o *GPUOp[T]) RunSequential(ctx context.Context) error { return o.do(ctx, o.seq) }

// Gather runs only the gather (t_comm).
func (o *GPUOp[T]) Gather(ctx context.Context) error { return o.do(ctx, o.gather) }

// GEMM runs only the GEMMs, on whatever G holds (t_gemm).
func (o *GPUOp[T]) GEMM(ctx context.Context) error { return o.do(ctx, o.gemm) }

// Close releases the graphs, streams, events and memory (collective: the
// symmetric A is freed once every rank has closed).
func (o *GPUOp[T]) Close() error {
	var errs []error
	for _, r := range []*cudagraph.Runner{o.run, o.seq, o.gather, o.gemm} {
		if r != nil {
			errs = append(errs, r.Close())
		}
	}
	for _, e := range append([]*device.CUDAEvent{o.fork, o.join}, o.events...) {
		errs = append(errs, e.Close())
	}
	if o.blas != 0 {
		errs = append(errs, o.lib.BlasDestroy(o.gpu.Ordinal, o.blas))
		o.blas = 0
	}
	errs = append(errs, o.comm.Close(), o.compute.Close())
	for _, b := range []*device.CUDABuffer{o.B, o.C, o.G} {
		errs = append(errs, b.Free())
	}
	if o.sym != nil {
		ctx, cancel := context.WithTimeout(context.Background(), o.c.Timeout())
		errs = append(errs, o.sym.Free(ctx))
		cancel()
		o.sym = nil
	}
	return errors.Join(errs...)
}
