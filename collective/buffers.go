package collective

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/fault"
)

// The backend-neutral API: code above collective plans all-gathers of
// device.Buffer values and orders its own work on Stream(), whichever
// backend Init chose; the buffers' kind is the only place the backend
// shows.

// Device is the communicator's device: device.CPUDevice{} on the CPU
// backend, the GPU that Init opened on the CUDA one (CPUDevice{} once
// closed). Buffers for PlanBuffers come from its NewBuffer, or, for
// symmetric memory on the CPU, device.NewHostBuffer over Alloc's bytes.
func (c *Communicator) Device() device.Device {
	if c.gpu != nil {
		return c.gpu.dev
	}
	return device.CPUDevice{}
}

// Stream is the stream the communicator's plans of device.Buffer values
// are ordered on: the GPU's stream on CUDA; on the CPU a device.CPUStream
// that the communicator makes at Init and closes in Close (the caller
// does not close it). nil once closed. Work enqueued on it before a
// plan's Launch is done before the gather reads its source; work enqueued
// after Launch returns sees the gathered data. Another stream orders its
// work after a gather with an event recorded here.
func (c *Communicator) Stream() device.Stream {
	if c.gpu != nil {
		return c.gpu.stream
	}
	if c.stream == nil {
		return nil // closed: not a typed nil
	}
	return c.stream
}

// PlanBuffers prepares an all-gather of equal blocks of the backend's
// memory (a collective call, as is the plan's Close): src, this rank's
// block, lands at Rank()·src.Size() of dst on every rank; in place (src
// a slice of dst at this rank's offset) works. dst and src are
// *device.HostBuffer values on the CPU backend and *device.CUDABuffer
// values on CUDA; a buffer of another kind is ErrInvalid.
//
// The plan's Launch is ordered on Stream() on both backends: the gather
// reads src after the work already enqueued there, and work enqueued
// there after Launch sees dst gathered. On the CPU, Launch waits for that
// stream's pending work, gathers on the calling goroutine and returns
// with dst complete; on the GPU it enqueues the gather where the engine
// can (see Plan.Mode), and Check collects its outcome.
//
// On CUDA the engine chosen at Init runs the plan: within a node the LL
// kernel, captured into a CUDA graph on its first Run unless
// Options.Eager; across nodes the NVSHMEM kernel (equal blocks packed in
// rank order) where every rank loads libslimenvshmem.so, otherwise the
// job's algorithm (hier or the ring) over the node's GPU group and TCP,
// blocks staged through pinned host memory; host staging where the
// node's GPUs cannot reach each other. A plan that stages is synchronous:
// Launch waits for the work already on Stream(), gathers, and returns
// once dst is complete (it cannot be captured into a CUDA graph).
func (c *Communicator) PlanBuffers(ctx context.Context, dst, src device.Buffer) (*Plan, error) {
	hd, hs, gd, gs, err := c.buffers("allgather", dst, src)
	if err != nil {
		return nil, err
	}
	if gd != nil {
		return c.planGPUEqual(ctx, gd, gs)
	}
	p, err := c.Plan(hd.Bytes(), hs.Bytes())
	return c.onStream(p, err)
}

// PlanBuffersV is PlanBuffers with counts[r] bytes from rank r, packed in
// rank order in dst; every rank passes the same counts.
func (c *Communicator) PlanBuffersV(ctx context.Context, dst, src device.Buffer, counts []int) (*Plan, error) {
	hd, hs, gd, gs, err := c.buffers("allgatherv", dst, src)
	if err != nil {
		return nil, err
	}
	if gd != nil {
		return c.planGPUV(ctx, gd, gs, counts)
	}
	if len(counts) == c.Size() && counts[c.Rank()] != hs.Size() {
		return nil, fault.New("allgatherv", c.Rank(), -1, ErrInvalid, "src holds %d bytes, counts say %d", hs.Size(), counts[c.Rank()])
	}
	p, err := c.PlanV(hd.Bytes(), hs.Bytes(), counts)
	return c.onStream(p, err)
}

// PlanBuffersBlocks is PlanBuffers with explicit placement: rank r's
// sizes[r] bytes land at offs[r] of dst on every rank, src being this
// rank's block. Every rank passes the same sizes. Package overlap
// gathers a matrix's rows piece by piece with it.
func (c *Communicator) PlanBuffersBlocks(ctx context.Context, dst, src device.Buffer, sizes, offs []int) (*Plan, error) {
	hd, hs, gd, gs, err := c.buffers("allgatherv", dst, src)
	if err != nil {
		return nil, err
	}
	if gd != nil {
		return c.planGPUBlocks(ctx, gd, gs, sizes, offs)
	}
	if len(sizes) == c.Size() && sizes[c.Rank()] != hs.Size() {
		return nil, fault.New("allgatherv", c.Rank(), -1, ErrInvalid, "src holds %d bytes, sizes say %d", hs.Size(), sizes[c.Rank()])
	}
	for r := range min(len(sizes), len(offs)) {
		if !blockIn(sizes[r], offs[r], hd.Size()) {
			return nil, fault.New("allgatherv", c.Rank(), -1, ErrInvalid, "rank %d's block [%d, +%d) is not in dst's %d bytes", r, offs[r], sizes[r], hd.Size())
		}
	}
	p, err := c.PlanBlocks(hd.Bytes(), hs.Bytes(), sizes, offs)
	return c.onStream(p, err)
}

// blockIn says whether size bytes at off lie in n bytes, without forming
// off+size (which may overflow int).
func blockIn(size, off, n int) bool {
	return size >= 0 && off >= 0 && off <= n && size <= n-off
}

// buffers sorts dst and src by backend: both host buffers on the CPU
// backend, both CUDA buffers on CUDA; anything else is ErrInvalid naming
// op.
func (c *Communicator) buffers(op string, dst, src device.Buffer) (hd, hs *device.HostBuffer, gd, gs *device.CUDABuffer, err error) {
	if c.eng == nil {
		return nil, nil, nil, nil, c.closedErr(op)
	}
	want := c.Backend()
	bad := func(what string, b device.Buffer) error {
		return fault.New(op, c.Rank(), -1, ErrInvalid, "%s is a %T; the communicator's backend (%v) takes *device.%s", what, b, want, map[device.Kind]string{device.CPU: "HostBuffer", device.CUDA: "CUDABuffer"}[want])
	}
	if want == device.CUDA {
		var ok bool
		if gd, ok = dst.(*device.CUDABuffer); !ok || gd == nil {
			return nil, nil, nil, nil, bad("dst", dst)
		}
		if gs, ok = src.(*device.CUDABuffer); !ok || gs == nil {
			return nil, nil, nil, nil, bad("src", src)
		}
		return nil, nil, gd, gs, nil
	}
	var ok bool
	if hd, ok = dst.(*device.HostBuffer); !ok || hd == nil {
		return nil, nil, nil, nil, bad("dst", dst)
	}
	if hs, ok = src.(*device.HostBuffer); !ok || hs == nil {
		return nil, nil, nil, nil, bad("src", src)
	}
	return hd, hs, nil, nil, nil
}

// onStream orders a host plan of buffers on the communicator's CPU
// stream.
func (c *Communicator) onStream(p *Plan, err error) (*Plan, error) {
	if err != nil {
		return nil, err
	}
	p.eng = streamPlan{op: p.eng.(hostPlan).op, c: c, closed: new(bool)}
	return p, nil
}

// streamPlan is a host plan of buffers on the CPU backend: each launch
// waits for the work pending on the communicator's stream (which may
// write its source), then gathers to completion, so that the stream's
// later work sees the result: the order a GPU plan has on its stream.
// Where that wait fails (the work failed, a deadline passed) the launch
// takes part as a refused call and returns the failure.
//
// closed is set by the plan's Close, after which a launch is ErrClosed, as
// a GPU plan's is; it is a pointer made at planning, so that the plan (a
// value in Plan's interface) copies nothing per launch.
type streamPlan struct {
	op     planned[[]byte]
	c      *Communicator
	closed *bool
}

func (s streamPlan) launch(ctx context.Context) error {
	st := s.c.stream
	if st == nil {
		return s.c.closedErr("allgather")
	}
	if *s.closed {
		// Closed here, maybe not on the peers (a closed plan's launch is
		// a mistake of this rank's): take part as below.
		return s.c.leaveOut(ctx, "allgather", fault.New("allgather", s.c.Rank(), -1, ErrPlanClosed, "Plan.Close was called; the communicator is open: plan the call again"))
	}
	if err := s.c.syncCPU(ctx, "allgather", st); err != nil {
		// The gather is left out, but the peers may be in it already:
		// take part as a refused call does, so that they learn of it at
		// once instead of at their timeout, and do not take this rank's
		// next call (another iteration's data) for this one. ctx may be
		// what ended; the engine's waits keep the communicator's
		// timeout.
		return s.c.leaveOut(context.WithoutCancel(ctx), "allgather", err)
	}
	return s.op.Run(ctx)
}

func (streamPlan) wait(context.Context) error { return nil }
func (streamPlan) mode() string               { return "host" }
func (s streamPlan) close() error             { *s.closed = true; return nil }

// syncCPU waits for the work on st, a CPU stream, within the
// communicator's timeout as well as ctx (every wait is bounded by
// Options.Timeout): an idle stream answers at once, without a lock or an
// allocation; a busy one is waited for (CPUStream.SynchronizeBy, which
// allocates nothing).
func (c *Communicator) syncCPU(ctx context.Context, op string, st *device.CPUStream) error {
	if st.Idle() {
		return nil // no clock read either: a planned collective asks every call
	}
	if err := st.SynchronizeBy(ctx, time.Now().Add(c.opts.Timeout)); err != nil {
		return c.streamErr(op, err)
	}
	return nil
}

// streamErr wraps an error of a CPU stream's wait: ErrTimeout where a
// deadline (ctx's or the communicator's timeout) passed, ctx's error
// where ctx was cancelled (as storeFault does), the stream's own failure
// otherwise.
func (c *Communicator) streamErr(op string, err error) error {
	var oe *fault.OpError
	switch {
	case errors.As(err, &oe):
		return err
	case errors.Is(err, context.Canceled):
		return fault.New(op, c.Rank(), -1, err, "waiting for the stream")
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, device.ErrWaitTimeout):
		return fault.New(op, c.Rank(), -1, fmt.Errorf("%w: %w", ErrTimeout, err), "waiting for the stream (timeout %v)", c.opts.Timeout)
	}
	return fault.New(op, c.Rank(), -1, err, "work on the stream failed")
}

// Synchronize waits for the work enqueued on s, a stream of the
// communicator's backend (a *device.CPUStream on the CPU, a
// *device.CUDAStream on CUDA; another is ErrInvalid), then reports what
// the communicator's kernels saw: a peer that did not arrive is an
// *OpError naming it. On both backends the wait is bounded by the
// communicator's timeout and by ctx (ErrTimeout when a deadline passes;
// a cancelled ctx's error otherwise); on the GPU a wait that gives up
// breaks the GPU path. On the CPU a failure of the stream's work (which a
// CPUStream keeps until Reset) is returned wrapped.
// Operators that order their own work after the communicator's plans
// (package overlap) end a run with it.
func (c *Communicator) Synchronize(ctx context.Context, s device.Stream) error {
	const op = "synchronize"
	if c.eng == nil {
		return c.closedErr(op)
	}
	if c.gpu != nil {
		cs, ok := s.(*device.CUDAStream)
		if !ok || cs == nil {
			return fault.New(op, c.Rank(), -1, ErrInvalid, "a %T on the cuda backend (want *device.CUDAStream)", s)
		}
		return c.syncGPU(ctx, op, cs)
	}
	cs, ok := s.(*device.CPUStream)
	if !ok || cs == nil {
		return fault.New(op, c.Rank(), -1, ErrInvalid, "a %T on the cpu backend (want *device.CPUStream)", s)
	}
	return c.syncCPU(ctx, op, cs)
}
