package collective

import (
	"context"
	"errors"
	"slices"

	"github.com/slimego/slimego/cudagraph"
	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/inter"
	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/intra"
	"github.com/slimego/slimego/nvshmem"
)

// devEngine is the all-gather of device memory that Init chose for the
// CUDA backend, held in gpuState.eng; the communicator never asks which
// it is. The engines are:
//   - llEngine: the node's LL kernel (one node whose GPUs reach each
//     other);
//   - acrossEngine: the job's algorithm (hier or the ring) across nodes,
//     over the node's LL group and TCP, blocks staged through pinned host
//     memory;
//   - hostStagedEngine: through host memory and the CPU backend's engine
//     (no P2P between the node's GPUs, and nothing else applies);
//   - nvEngine: the NVSHMEM kernel across nodes, in front of one of the
//     two above for the blocks it cannot do.
type devEngine interface {
	// plan prepares one all-gather: rank r's counts[r] bytes land at
	// offs[r] of dst, src being this rank's block. It is a collective
	// call; the arguments are checked already.
	plan(ctx context.Context, dst, src *device.CUDABuffer, counts, offs []int) (devPlanned, error)
	// describe says how the engine moves data across nodes, for
	// reports: empty on one node.
	describe() string
	// close releases what the engine holds (links, teams), once.
	close()
}

// devPlanned is one planned all-gather of a devEngine. Its launch and
// wait allocate nothing.
type devPlanned interface {
	// launch starts the all-gather after the work on the communicator's
	// stream: enqueued there where capturable, otherwise run to
	// completion.
	launch(ctx context.Context) error
	// wait waits for what launch started and reports what it saw.
	wait(ctx context.Context) error
	// capturable says whether launch only enqueues kernels on the
	// communicator's stream, so that it can be (and, unless eager, is)
	// captured into a CUDA graph; false for a plan that runs
	// synchronously on the host.
	capturable() bool
	mode() string
	// close releases the plan; a collective call where the plan's
	// kernels or links are shared with peers.
	close() error
}

// packed is the offsets of blocks of counts bytes one after another.
func packed(counts []int) []int {
	offs := make([]int, len(counts))
	for r := 1; r < len(counts); r++ {
		offs[r] = offs[r-1] + counts[r-1]
	}
	return offs
}

// llEngine is the node's LL kernel, on one node whose GPUs reach each
// other.
type llEngine struct{ c *Communicator }

func (e llEngine) plan(ctx context.Context, dst, src *device.CUDABuffer, counts, offs []int) (devPlanned, error) {
	np, err := e.c.gpu.node.Plan(dst.Ptr, src.Ptr, counts, offs)
	if err != nil {
		return nil, err
	}
	return newKernelPlanned(ctx, e.c, np.Launch, nil)
}

func (llEngine) describe() string { return "" }
func (llEngine) close()           {}

// nvEngine is the NVSHMEM team across nodes: its kernel takes equal
// blocks packed in rank order; other blocks go to the engine chosen
// without it (across or host staging).
type nvEngine struct {
	c     *Communicator
	team  *nvshmem.Team
	other devEngine
}

func (e nvEngine) plan(ctx context.Context, dst, src *device.CUDABuffer, counts, offs []int) (devPlanned, error) {
	uniform := true
	for _, n := range counts {
		uniform = uniform && n == counts[0]
	}
	if !uniform || !slices.Equal(offs, packed(counts)) {
		return e.other.plan(ctx, dst, src, counts, offs)
	}
	nv, err := e.team.Plan(ctx, src.Ptr, dst.Ptr, counts[0])
	if err != nil {
		return nil, err
	}
	return newKernelPlanned(ctx, e.c, nv.Launch, nv)
}

func (e nvEngine) describe() string {
	if _, ok := e.other.(*acrossEngine); ok {
		return "nvshmem, otherwise " + e.other.describe()
	}
	return "nvshmem"
}

func (e nvEngine) close() {
	e.other.close()
	e.team.Close()
}

// kernelPlanned is a plan of kernels on the communicator's stream (the LL
// kernel, or NVSHMEM's), replayed as a CUDA graph unless Options.Eager.
type kernelPlanned struct {
	c      *Communicator
	runner *cudagraph.Runner
	nv     *nvshmem.AllGather // nil for the LL kernel
}

func newKernelPlanned(ctx context.Context, c *Communicator, launch cudagraph.Launcher, nv *nvshmem.AllGather) (*kernelPlanned, error) {
	k := &kernelPlanned{c: c, runner: cudagraph.New(c.gpu.stream, c.opts.Eager || cudagraph.Eager(), launch), nv: nv}
	// cudaMalloc and cudaFree may wait for the whole device, and so may a
	// kernel's first launch or capture (lazy module loading): a rank still
	// allocating or capturing while a peer's kernel already waits for it
	// would stall both. Every rank captures its graph (graph mode) and
	// finishes planning before any runs.
	err := k.runner.Prepare()
	if err != nil {
		err = fault.New("allgather", c.Rank(), -1, err, "capture (%s mode)", k.runner.Mode())
	} else {
		err = c.Barrier(ctx)
	}
	if err != nil {
		k.runner.Close()
		if nv != nil {
			// NVSHMEM frees the plan's symmetric memory only collectively,
			// which the peers of a failed plan may never join: the GPU path
			// stops here rather than leak a plan's memory per call.
			c.gpu.broken = err
		}
		return nil, err
	}
	return k, nil
}

func (k *kernelPlanned) capturable() bool { return true }
func (k *kernelPlanned) mode() string     { return k.runner.Mode() }

func (k *kernelPlanned) launch(ctx context.Context) error {
	if err := k.c.gpu.check(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		// Done before the call began: nothing is launched, since this
		// rank's kernels would complete the call on its peers while it
		// fails. The kernels give peers no way to learn of it: theirs
		// wait for this rank's blocks until their timeout, which names
		// it, and the GPU path is broken here.
		kind := ErrTimeout
		if errors.Is(err, context.Canceled) {
			kind = context.Canceled
		}
		k.c.gpu.broken = fault.New("allgather", k.c.Rank(), -1, kind, "the context was done before the call began: nothing launched")
		return k.c.gpu.broken
	}
	if err := k.runner.Run(); err != nil {
		return fault.New("allgather", k.c.Rank(), -1, err, "launch (%s mode)", k.runner.Mode())
	}
	return nil
}

func (k *kernelPlanned) wait(ctx context.Context) error {
	g := k.c.gpu
	if err := k.c.syncStream(ctx, "allgather", g.stream); err != nil {
		return err
	}
	if k.nv != nil {
		if err := k.nv.Check(); err != nil {
			g.broken = err
			return err
		}
	}
	return g.check()
}

// close returns once every rank has closed the plan (unless the GPU path
// is broken), so that no peer's kernel still reads the buffers freed
// after it.
func (k *kernelPlanned) close() error {
	var errs []error
	if g := k.c.gpu; g != nil && g.broken == nil {
		ctx, cancel := context.WithTimeout(context.Background(), k.c.opts.Timeout)
		errs = append(errs, k.c.Barrier(ctx))
		cancel()
	}
	errs = append(errs, k.runner.Close())
	if k.nv != nil {
		errs = append(errs, k.nv.Close())
	}
	return errors.Join(errs...)
}

// acrossEngine is the job's algorithm across nodes over device memory:
// hier over the node's LL group (gnode) and the staged link, or the ring
// over the link alone.
type acrossEngine struct {
	c     *Communicator
	algo  engine[intra.DevSpan]
	gnode *intra.GPUNode // nil under the ring
	link  *inter.Staged
}

func (e *acrossEngine) plan(ctx context.Context, dst, src *device.CUDABuffer, counts, offs []int) (devPlanned, error) {
	c := e.c
	if err := c.gpu.check(); err != nil {
		return nil, err
	}
	op, err := e.algo.Plan("allgather", intra.Span(dst), intra.Span(src), counts, offs)
	if err != nil {
		return nil, err
	}
	// As for the kernels: every rank finishes planning (the LL group's
	// allocations) before any runs.
	if err := c.Barrier(ctx); err != nil {
		return nil, err
	}
	return &acrossPlanned{c: c, op: op}, nil
}

func (e *acrossEngine) describe() string { return e.c.opts.Algo + " over host-staged tcp" }

// close releases the staged link (its pinned buffers, its stream, its TCP
// connections), then the node's LL view.
func (e *acrossEngine) close() {
	if e.link != nil {
		e.link.Close()
	}
	if e.gnode != nil {
		e.gnode.Close()
	}
}

// acrossPlanned is synchronous: launch waits for the communicator's
// stream, runs the op and returns when dst is complete.
type acrossPlanned struct {
	c  *Communicator
	op planned[intra.DevSpan]
}

func (a *acrossPlanned) capturable() bool           { return false }
func (a *acrossPlanned) mode() string               { return "staged" }
func (a *acrossPlanned) wait(context.Context) error { return nil }

// launch runs the algorithm once the work enqueued on the communicator's
// stream (which may write src) is done, since the node's kernels and the
// link's copies run on streams of their own. Any failure breaks the GPU
// path: a size mismatch leaves the LL group at another epoch than its
// peers (hier), and a lost or late peer leaves blocks in flight; later
// calls return ErrClosed (gpuState.closed).
func (a *acrossPlanned) launch(ctx context.Context) error {
	g := a.c.gpu
	if err := g.check(); err != nil {
		return err
	}
	if err := a.c.syncStream(ctx, "allgather", g.stream); err != nil {
		return err
	}
	if err := a.op.Run(ctx); err != nil {
		g.broken = err
		return err
	}
	return nil
}

func (a *acrossPlanned) close() error {
	if g := a.c.gpu; g != nil && g.broken == nil {
		ctx, cancel := context.WithTimeout(context.Background(), a.c.opts.Timeout)
		defer cancel()
		return a.c.Barrier(ctx)
	}
	return nil
}

// hostStagedEngine moves device memory through host memory and the
// communicator's host engine: across nodes where nothing else applies,
// and within a node whose GPUs cannot reach each other.
type hostStagedEngine struct{ c *Communicator }

func (e hostStagedEngine) describe() string {
	if e.c.nodes > 1 {
		return "host-staged tcp"
	}
	return ""
}

func (hostStagedEngine) close() {}

// plan stages the GPU block to host memory, runs the CPU backend's
// all-gather, and copies the result back to dst: in one copy where the
// blocks are packed, block by block otherwise.
func (e hostStagedEngine) plan(_ context.Context, dst, src *device.CUDABuffer, counts, offs []int) (devPlanned, error) {
	c := e.c
	p := &hostStagedPlanned{c: c, src: src}
	pk := packed(counts)
	total := pk[len(pk)-1] + counts[len(counts)-1]
	p.hostSrc = make([]byte, src.Len)
	p.hostD = make([]byte, total)
	hp, err := c.PlanV(p.hostD, p.hostSrc, counts)
	if err != nil {
		return nil, err
	}
	p.host = hp
	if slices.Equal(offs, pk) {
		whole, err := dst.Slice(0, total)
		if err != nil {
			return nil, fault.New("allgather", c.Rank(), -1, ErrInvalid, "%v", err)
		}
		p.back, p.backOff = []*device.CUDABuffer{whole}, []int{0}
		return p, nil
	}
	for r := range counts {
		if counts[r] == 0 {
			continue
		}
		b, err := dst.Slice(offs[r], counts[r])
		if err != nil {
			return nil, fault.New("allgather", c.Rank(), -1, ErrInvalid, "%v", err)
		}
		p.back, p.backOff = append(p.back, b), append(p.backOff, pk[r])
	}
	return p, nil
}

// hostStagedPlanned is synchronous: src goes to hostSrc, the host plan
// gathers into hostD (blocks packed in rank order), and each piece of
// hostD goes back to its place in dst.
type hostStagedPlanned struct {
	c       *Communicator
	host    *Plan
	hostSrc []byte
	hostD   []byte
	src     *device.CUDABuffer
	back    []*device.CUDABuffer // where hostD's pieces go
	backOff []int                // and where each starts in hostD
}

func (h *hostStagedPlanned) capturable() bool           { return false }
func (h *hostStagedPlanned) mode() string               { return "host-staged" }
func (h *hostStagedPlanned) wait(context.Context) error { return nil }
func (h *hostStagedPlanned) close() error               { return nil }

// launch waits for the work on the communicator's stream (which may
// write src: the copy to the host is not ordered after it), then stages.
func (h *hostStagedPlanned) launch(ctx context.Context) error {
	if err := h.c.syncStream(ctx, "allgather", h.c.gpu.stream); err != nil {
		return err
	}
	if err := h.src.CopyToHost(h.hostSrc); err != nil {
		return fault.New("allgather", h.c.Rank(), -1, err, "staging to the host")
	}
	// The host plan's engine directly: the caller (Plan.Launch) records
	// the failure for the launcher, once.
	if err := h.host.eng.launch(ctx); err != nil {
		return err
	}
	if err := h.host.eng.wait(ctx); err != nil {
		return err
	}
	for i, b := range h.back {
		if err := b.CopyFromHost(h.hostD[h.backOff[i] : h.backOff[i]+b.Len]); err != nil {
			return fault.New("allgather", h.c.Rank(), -1, err, "staging from the host")
		}
	}
	return nil
}
