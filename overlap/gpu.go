package overlap

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/kernels"
)

// gpuEngine runs an Op on the communicator's GPU. The gather is the
// communicator's: one device-memory plan per piece (PlanGPUBlocks), each
// launched on the communicator's stream (its LL kernel on one node, or
// NVSHMEM or host staging across nodes) and followed by an event; cuBLAS
// runs on a compute stream, this rank's own rows at once and each piece's
// rows once its event is reached. The compute stream forks off the
// communicator's stream at the start of a run and joins it at the end, so
// that waiting for that stream waits for the whole run.
type gpuEngine[T Float] struct {
	o             *Op[T]
	gpu           *device.GPU
	lib           *kernels.Lib
	comm, compute *device.CUDAStream // comm is the communicator's
	fork, join    *device.CUDAEvent
	events        []*device.CUDAEvent // one per piece
	blas          kernels.Blas
}

func newGPUEngine[T Float](ctx context.Context, o *Op[T]) (_ *gpuEngine[T], err error) {
	c := o.c
	gpu := c.GPU()
	e := &gpuEngine[T]{o: o, gpu: gpu, lib: gpu.Lib(), comm: c.GPUStream()}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	P, m, n, k, esz := o.P, o.m, o.n, o.k, o.esz()
	for _, b := range []struct {
		dst   **device.CUDABuffer
		bytes int
	}{{&o.DevA, m * k * esz}, {&o.DevB, k * n * esz}, {&o.DevC, P * m * n * esz}, {&o.DevG, P * m * k * esz}} {
		if *b.dst, err = gpu.Alloc(b.bytes); err != nil {
			return nil, err
		}
	}
	if e.compute, err = gpu.NewCUDAStream(); err != nil {
		return nil, err
	}
	if e.blas, err = e.lib.BlasCreate(gpu.Ordinal); err != nil {
		return nil, err
	}
	for _, ev := range []**device.CUDAEvent{&e.fork, &e.join} {
		if *ev, err = gpu.NewCUDAEvent(false); err != nil {
			return nil, err
		}
	}
	for _, p := range o.pieces {
		ev, err := gpu.NewCUDAEvent(false)
		if err != nil {
			return nil, err
		}
		e.events = append(e.events, ev)
		src, err := o.DevA.Slice(p.Lo*k*esz, (p.Hi-p.Lo)*k*esz)
		if err != nil {
			return nil, fmt.Errorf("overlap: rank %d: %w", o.me, err)
		}
		sizes, offs := o.blocks(p)
		plan, err := c.PlanGPUBlocks(ctx, o.DevG, src, sizes, offs)
		if err != nil {
			return nil, err
		}
		o.plans = append(o.plans, plan)
	}
	return e, nil
}

func (e *gpuEngine[T]) mode() string {
	if len(e.o.plans) > 0 {
		return e.o.plans[0].Mode()
	}
	if e.o.c.Options().Eager {
		return "eager"
	}
	return "graph"
}

// gemmTask enqueues task t's rows of C on the compute stream: from A for
// this rank's rows (unless fromG), from G for the others'.
func (e *gpuEngine[T]) gemmTask(t Task, fromG bool) error {
	o, s := e.o, e.compute
	rows, esz := t.Hi-t.Lo, o.esz()
	if rows == 0 || o.n == 0 {
		return nil
	}
	cRows := o.DevC.Ptr + kernels.Ptr((t.Rank*o.m+t.Lo)*o.n*esz)
	if o.k == 0 {
		return e.lib.MemsetAsync(e.gpu.Ordinal, cRows, 0, uint64(rows*o.n*esz), s.H)
	}
	a := o.DevG.Ptr + kernels.Ptr((t.Rank*o.m+t.Lo)*o.k*esz)
	if t.Rank == o.me && !fromG {
		a = o.DevA.Ptr + kernels.Ptr(t.Lo*o.k*esz)
	}
	if esz == 4 {
		return e.lib.GemmF32(e.gpu.Ordinal, e.blas, s.H, rows, o.n, o.k, a, o.k, o.DevB.Ptr, o.n, cRows, o.n)
	}
	return e.lib.GemmF64(e.gpu.Ordinal, e.blas, s.H, rows, o.n, o.k, a, o.k, o.DevB.Ptr, o.n, cRows, o.n)
}

// forkCompute orders the compute stream's next work after what the
// communicator's stream holds now.
func (e *gpuEngine[T]) forkCompute() error {
	if err := e.fork.Record(e.comm); err != nil {
		return err
	}
	return e.compute.Wait(e.fork)
}

// finish joins the compute stream into the communicator's stream, waits
// for both within the communicator's timeout, and reports what the
// kernels saw; err, an error of the launches, comes first.
func (e *gpuEngine[T]) finish(ctx context.Context, err error) error {
	if jerr := e.join.Record(e.compute); jerr != nil {
		err = cmp.Or(err, jerr)
	} else if jerr := e.comm.Wait(e.join); jerr != nil {
		err = cmp.Or(err, jerr)
	}
	if serr := e.o.c.SyncGPU(ctx, "allgather-gemm", e.comm); serr != nil || err != nil {
		return cmp.Or(err, serr)
	}
	for _, p := range e.o.plans {
		if err := p.Check(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (e *gpuEngine[T]) run(ctx context.Context) error {
	if err := e.forkCompute(); err != nil {
		return e.finish(ctx, err)
	}
	tasks, i := e.o.tasks, 0
	for ; i < len(tasks) && tasks[i].Piece < 0; i++ {
		if err := e.gemmTask(tasks[i], false); err != nil {
			return e.finish(ctx, err)
		}
	}
	for p, plan := range e.o.plans {
		if err := plan.Launch(ctx); err != nil {
			return e.finish(ctx, err)
		}
		if err := e.events[p].Record(e.comm); err != nil {
			return e.finish(ctx, err)
		}
		if err := e.compute.Wait(e.events[p]); err != nil {
			return e.finish(ctx, err)
		}
		for ; i < len(tasks) && tasks[i].Piece == p; i++ {
			if err := e.gemmTask(tasks[i], false); err != nil {
				return e.finish(ctx, err)
			}
		}
	}
	return e.finish(ctx, nil)
}

func (e *gpuEngine[T]) launchGather(ctx context.Context) error {
	for _, plan := range e.o.plans {
		if err := plan.Launch(ctx); err != nil {
			return err
		}
	}
	return nil
}

// launchGEMMs enqueues every GEMM on the compute stream, all rows from G,
// after what the communicator's stream holds.
func (e *gpuEngine[T]) launchGEMMs() error {
	if err := e.forkCompute(); err != nil {
		return err
	}
	for _, t := range e.o.tasks {
		if err := e.gemmTask(t, true); err != nil {
			return err
		}
	}
	return nil
}

func (e *gpuEngine[T]) sequential(ctx context.Context) error {
	err := e.launchGather(ctx)
	if err == nil {
		err = e.launchGEMMs()
	}
	return e.finish(ctx, err)
}

func (e *gpuEngine[T]) gather(ctx context.Context) error {
	return e.finish(ctx, e.launchGather(ctx))
}

func (e *gpuEngine[T]) gemm(ctx context.Context) error {
	return e.finish(ctx, e.launchGEMMs())
}

func (e *gpuEngine[T]) close() error {
	o := e.o
	var errs []error
	for _, p := range o.plans {
		errs = append(errs, p.Close())
	}
	o.plans = nil
	for _, ev := range append([]*device.CUDAEvent{e.fork, e.join}, e.events...) {
		if ev != nil {
			errs = append(errs, ev.Close())
		}
	}
	if e.blas != 0 {
		errs = append(errs, e.lib.BlasDestroy(e.gpu.Ordinal, e.blas))
		e.blas = 0
	}
	if e.compute != nil {
		errs = append(errs, e.compute.Close())
	}
	for _, b := range []*device.CUDABuffer{o.DevA, o.DevB, o.DevC, o.DevG} {
		errs = append(errs, b.Free())
	}
	return errors.Join(errs...)
}
