package intra

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/kernels"
)

// Memory is what an algorithm over a node-local gather and an inter-node
// transport (package inter's Hier and ring) needs to know of the buffers it
// moves: how long one is, the part of one at an offset, whether two start
// at the same address, and how to copy one into another. M is []byte on
// the CPU backend (HostMem) and DevSpan on the CUDA one (GPUMem).
type Memory[M any] interface {
	Len(m M) int
	// Slice is the n bytes of m at off (0 ≤ off, off+n ≤ Len(m)).
	Slice(m M, off, n int) M
	// Same says whether a and b start at the same address (false when
	// either is empty).
	Same(a, b M) bool
	// Copy copies src into the start of dst and returns when the copy is
	// done, or at deadline (if not zero) with an error.
	Copy(dst, src M, deadline time.Time) error
}

// NodeOp is one planned node-local all-gather.
type NodeOp[M any] interface {
	// Set re-plans the operation for other buffers and sizes.
	Set(dst, src M, sizes, offs []int) error
	// Run executes it once and returns when this rank's part is done.
	Run(ctx context.Context) error
	// RunMismatched takes part with a hash (or size) no peer shares, so
	// that the node's other ranks return ErrSizeMismatch.
	RunMismatched(ctx context.Context) error
	// LeaveOwn says that the caller places this rank's own block in dst
	// itself (an optimisation an engine may ignore: see CanLeaveOwn).
	LeaveOwn(leave bool)
}

// NodeGather is a node-local all-gather engine, the intra-node half of the
// algorithms that span nodes: the shared-memory Group (Group.Node) and the
// CUDA LL group (GPUGroup.Node) implement it.
type NodeGather[M any] interface {
	Memory[M]
	// Rank is this rank's local rank, Size the node's ranks.
	Rank() int
	Size() int
	// Plan prepares an all-gather in which local rank s's sizes[s] bytes
	// land at offs[s] of dst; src holds this rank's block.
	Plan(name string, dst, src M, sizes, offs []int) (NodeOp[M], error)
	// Barrier returns once every rank of the node has entered it.
	Barrier(ctx context.Context) error
	// Abandon marks this rank as failed (a network error elsewhere): its
	// node's ranks stop waiting for it, and the engine is broken.
	Abandon(err error)
	// CanLeaveOwn says whether NodeOp.LeaveOwn is honoured.
	CanLeaveOwn() bool
}

var (
	_ NodeGather[[]byte]  = hostNode{}
	_ NodeGather[DevSpan] = (*GPUNode)(nil)
	_ NodeOp[[]byte]      = (*Op)(nil)
	_ NodeOp[DevSpan]     = (*gpuNodeOp)(nil)
)

// HostMem is the Memory of host byte slices.
type HostMem struct{}

func (HostMem) Len(m []byte) int                  { return len(m) }
func (HostMem) Slice(m []byte, off, n int) []byte { return m[off : off+n] }
func (HostMem) Same(a, b []byte) bool {
	return len(a) > 0 && len(b) > 0 && &a[0] == &b[0]
}
func (HostMem) Copy(dst, src []byte, _ time.Time) error {
	if len(src) > len(dst) {
		return fmt.Errorf("intra: copy of %d bytes into %d", len(src), len(dst))
	}
	copy(dst, src)
	return nil
}

// Node is g as a NodeGather of host memory.
func (g *Group) Node() NodeGather[[]byte] { return hostNode{g} }

// hostNode adapts Group, whose Plan returns its concrete *Op.
type hostNode struct{ *Group }

func (hostNode) Len(m []byte) int                        { return len(m) }
func (hostNode) Slice(m []byte, off, n int) []byte       { return m[off : off+n] }
func (hostNode) Same(a, b []byte) bool                   { return HostMem{}.Same(a, b) }
func (hostNode) Copy(dst, src []byte, d time.Time) error { return HostMem{}.Copy(dst, src, d) }
func (hostNode) CanLeaveOwn() bool                       { return true }

func (n hostNode) Plan(name string, dst, src []byte, sizes, offs []int) (NodeOp[[]byte], error) {
	op, err := n.Group.Plan(name, dst, src, sizes, offs)
	if err != nil {
		return nil, err
	}
	return op, nil
}

// DevSpan is N bytes of device memory at Ptr, on the GPU of the Memory
// that made it (a value: slicing one allocates nothing).
type DevSpan struct {
	Ptr kernels.Ptr
	N   int
}

// Span is b as a DevSpan.
func Span(b *device.CUDABuffer) DevSpan { return DevSpan{Ptr: b.Ptr, N: b.Len} }

// GPUMem is the Memory of one GPU's device spans. Its copies run on its
// own stream and are waited for: a copy between device addresses through
// cudaMemcpy returns before it is done, and is ordered with none of
// slimego's (non-blocking) streams.
type GPUMem struct {
	Dev *device.GPU
	S   *device.CUDAStream
}

// NewGPUMem makes the memory model of dev, with a stream of its own.
func NewGPUMem(dev *device.GPU) (GPUMem, error) {
	s, err := dev.NewCUDAStream()
	if err != nil {
		return GPUMem{}, err
	}
	return GPUMem{Dev: dev, S: s}, nil
}

func (GPUMem) Len(m DevSpan) int { return m.N }
func (GPUMem) Slice(m DevSpan, off, n int) DevSpan {
	if off < 0 || n < 0 || off+n > m.N {
		panic(fmt.Sprintf("intra: slice [%d, %d) of a %d-byte device span", off, off+n, m.N))
	}
	return DevSpan{Ptr: m.Ptr + kernels.Ptr(off), N: n}
}
func (GPUMem) Same(a, b DevSpan) bool { return a.N > 0 && b.N > 0 && a.Ptr == b.Ptr }

// Copy copies src into dst on the memory's stream and waits for it.
func (m GPUMem) Copy(dst, src DevSpan, deadline time.Time) error {
	if src.N > dst.N {
		return fmt.Errorf("intra: copy of %d bytes into %d", src.N, dst.N)
	}
	if src.N == 0 {
		return nil
	}
	if err := m.Dev.Lib().MemcpyAsync(m.Dev.Ordinal, dst.Ptr, src.Ptr, uint64(src.N), m.S.H); err != nil {
		return err
	}
	return m.S.SynchronizeBy(context.Background(), deadline)
}

// CopyIn copies host bytes into dst once the memory's stream has done its
// work, and returns when they have landed (the library's synchronous
// copies run on a stream of its own and wait for it).
func (m GPUMem) CopyIn(dst DevSpan, src []byte, deadline time.Time) error {
	if len(src) > dst.N {
		return fmt.Errorf("intra: %d bytes into a %d-byte device span", len(src), dst.N)
	}
	if err := m.S.SynchronizeBy(context.Background(), deadline); err != nil {
		return err
	}
	return m.Dev.Lib().CopyFromHost(m.Dev.Ordinal, dst.Ptr, src)
}

// CopyOut copies the start of src into host bytes once the memory's stream
// has done its work.
func (m GPUMem) CopyOut(dst []byte, src DevSpan, deadline time.Time) error {
	if len(dst) > src.N {
		return fmt.Errorf("intra: %d bytes out of a %d-byte device span", len(dst), src.N)
	}
	if err := m.S.SynchronizeBy(context.Background(), deadline); err != nil {
		return err
	}
	return m.Dev.Lib().CopyToHost(m.Dev.Ordinal, dst, src.Ptr)
}

// GPUNode is a GPU group as a NodeGather of device spans: each operation
// launches the group's kernels on the node's stream and waits for them
// (within the group's timeout), then reads the group's status word.
type GPUNode struct {
	GPUMem
	g       *GPUGroup
	barrier *kernels.BarrierArgs
}

// Node makes g a NodeGather with a stream of its own; Close releases the
// stream (the group stays g's caller's to close).
func (g *GPUGroup) Node() (*GPUNode, error) {
	m, err := NewGPUMem(g.cfg.Dev)
	if err != nil {
		return nil, g.fail("init", err)
	}
	return &GPUNode{GPUMem: m, g: g}, nil
}

// Close destroys the node's stream.
func (n *GPUNode) Close() error { return n.S.Close() }

func (n *GPUNode) Rank() int         { return n.g.cfg.Rank }
func (n *GPUNode) Size() int         { return n.g.cfg.Size }
func (n *GPUNode) CanLeaveOwn() bool { return false }

// Abandon breaks the group: the kernels give peers no way to learn of it,
// so they find out at their own timeout.
func (n *GPUNode) Abandon(err error) {
	if n.g.broken == nil {
		n.g.broken = fault.New("communicator", n.g.cfg.Ranks[n.g.cfg.Rank], -1, fault.ErrClosed, "broken by an earlier error: %v", err)
	}
}

// sync waits for the node's stream within the group's timeout and checks
// the status word. A wait that gives up (ctx, or the timeout) leaves a
// kernel in flight whose peers may be at another epoch: the group is
// broken from then on.
func (n *GPUNode) sync(ctx context.Context, op string) error {
	if err := n.S.SynchronizeBy(ctx, time.Now().Add(n.g.cfg.Timeout)); err != nil {
		g := n.g
		g.broken = fault.New(op, g.cfg.Ranks[g.cfg.Rank], -1, fault.ErrTimeout, "waiting for the node's GPU kernels: %v", err)
		return g.broken
	}
	return n.g.Check(op)
}

// Barrier runs the node's flag barrier kernel and waits for it.
func (n *GPUNode) Barrier(ctx context.Context) error {
	if n.g.broken != nil {
		return n.g.broken
	}
	if n.barrier == nil {
		n.barrier = n.g.BarrierArgs()
	}
	if err := n.g.lib.Barrier(n.g.dev, n.barrier, n.S.H); err != nil {
		return n.g.fail("barrier", err)
	}
	return n.sync(ctx, "barrier")
}

// Plan plans the LL all-gather of the node's blocks.
func (n *GPUNode) Plan(name string, dst, src DevSpan, sizes, offs []int) (NodeOp[DevSpan], error) {
	o := &gpuNodeOp{n: n, name: name}
	if err := o.Set(dst, src, sizes, offs); err != nil {
		return nil, err
	}
	return o, nil
}

type gpuNodeOp struct {
	n    *GPUNode
	name string
	p    *GPUPlan
}

// Set re-plans the kernels' arguments (it allocates them anew).
func (o *gpuNodeOp) Set(dst, src DevSpan, sizes, offs []int) error {
	g := o.n.g
	if g.broken != nil {
		return g.broken
	}
	me := g.cfg.Ranks[g.cfg.Rank]
	if len(sizes) == g.cfg.Size && len(offs) == g.cfg.Size {
		if sizes[g.cfg.Rank] != src.N {
			return fault.New(o.name, me, -1, fault.ErrInvalid, "source holds %d bytes, this rank's block is %d", src.N, sizes[g.cfg.Rank])
		}
		for s := range sizes {
			if sizes[s] < 0 || offs[s] < 0 || offs[s] > dst.N || sizes[s] > dst.N-offs[s] {
				return fault.New(o.name, me, -1, fault.ErrInvalid, "block of local rank %d (%d bytes at %d) does not fit the %d-byte destination", s, sizes[s], offs[s], dst.N)
			}
		}
	}
	p, err := g.Plan(dst.Ptr, src.Ptr, sizes, offs)
	if err != nil {
		return err
	}
	o.p = p
	return nil
}

func (o *gpuNodeOp) LeaveOwn(bool) {}

// Run launches the plan's kernels and waits for them. A group broken by
// a size mismatch still takes part, as RunMismatched: within one call of
// an algorithm over several node gathers (Hier) every rank of the node
// then completes the schedule and learns the verdict at once instead of at
// its timeout, and every later call is ErrSizeMismatch on every rank (the
// kernels advance their epochs in step whatever the status word says).
// Any other break refuses.
func (o *gpuNodeOp) Run(ctx context.Context) error {
	if b := o.n.g.broken; b != nil {
		if !errors.Is(b, fault.ErrSizeMismatch) {
			return b
		}
		return o.RunMismatched(ctx)
	}
	return o.launch(ctx)
}

func (o *gpuNodeOp) launch(ctx context.Context) error {
	if err := o.p.Launch(o.n.S); err != nil {
		return err
	}
	return o.n.sync(ctx, o.name)
}

// RunMismatched runs the kernels announcing a total no peer expects: each
// peer's kernel stops with the size status (ErrSizeMismatch, and its group
// is broken, as every size mismatch breaks a GPU group); this rank's
// gather runs as planned and it returns ErrSizeMismatch, broken likewise.
//
// A peer that saw the size status stops waiting for the others and runs
// on through its launches (the rest of the rounds, and the node gathers
// after this one), and may lap a peer still waiting in an earlier one,
// overwriting the flag it waits for: the kernels take a flag past the
// epoch waited for as the size status naming that peer (kernels/
// protocol.h), so the lapped rank returns ErrSizeMismatch too, at once,
// not ErrTimeout at the kernel's timeout.
func (o *gpuNodeOp) RunMismatched(ctx context.Context) error {
	g := o.n.g
	if b := g.broken; b != nil && !errors.Is(b, fault.ErrSizeMismatch) {
		return b
	}
	for j := range o.p.rounds {
		o.p.rounds[j].Total ^= mismatchSalt
	}
	err := o.launch(ctx)
	for j := range o.p.rounds {
		o.p.rounds[j].Total ^= mismatchSalt
	}
	if err != nil && !errors.Is(err, fault.ErrSizeMismatch) {
		return err
	}
	if g.broken == nil {
		g.broken = fault.New(o.name, g.cfg.Ranks[g.cfg.Rank], -1, fault.ErrSizeMismatch, "a block of another size on another node; the communicator must be closed")
	}
	return g.broken
}
