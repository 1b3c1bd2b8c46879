package collective

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/inter"
	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/intra"
	"github.com/slimego/slimego/kernels"
	"github.com/slimego/slimego/nvshmem"
	"github.com/slimego/slimego/topology"
)

// gpuState is a communicator's CUDA backend: its GPU, the stream its
// collectives run on, the node's LL all-gather group, and the one engine
// for device memory that Init chose (see devEngine).
type gpuState struct {
	dev    *device.GPU
	stream *device.CUDAStream
	// node is the node's LL group: nil where the node's GPUs cannot reach
	// each other (NVML's P2P answer; noP2P in tests).
	node   *intra.GPUGroup
	eng    devEngine
	broken error // a failure after which the GPU path cannot go on
	rank   int   // this rank, for closed's errors
}

// initGPU opens GPU LOCAL_RANK mod the number of GPUs (several ranks may
// share one) and sets up the node's GPU group.
func (c *Communicator) initGPU(ctx context.Context, lay layout) error {
	o := c.opts
	dev, err := device.OpenLocalGPU(o.LocalRank)
	if err != nil {
		return fault.New("init", o.Rank, -1, ErrInvalid, "%v", err)
	}
	g := &gpuState{dev: dev, rank: o.Rank}
	c.gpu = g
	if g.stream, err = dev.NewCUDAStream(); err != nil {
		return fault.New("init", o.Rank, -1, err, "stream")
	}
	// Ranks on GPUs that cannot read each other (NVML's P2P answer) move
	// node-local data through host memory instead of CUDA IPC.
	p2p, err := c.nodeP2P(ctx, lay, dev)
	if err != nil {
		return err
	}
	if p2p {
		g.node, err = intra.NewGPU(ctx, intra.GPUConfig{
			Store: c.store, Key: c.key("gpu" + strconv.Itoa(lay.myNode)),
			Rank: o.LocalRank, Size: len(lay.members[lay.myNode]), Ranks: lay.members[lay.myNode],
			Dev: dev, Cap: o.GPUScratch, Blocks: o.GPUBlocks, Timeout: o.Timeout,
		}) // otherwise g.node stays nil: node-local data goes through the host
		if err != nil {
			return err
		}
	}
	return c.initEngine(ctx)
}

// initEngine chooses the communicator's one engine for device memory.
// On one node: the LL kernel where the node's GPUs reach each other,
// host staging otherwise. Across nodes: the job's algorithm over the
// staged link where it can run (across), host staging otherwise; and,
// where every rank joins NVSHMEM, the NVSHMEM kernel in front of that
// engine, which still takes the blocks the kernel cannot (uneven or not
// packed). Every rank decides alike.
func (c *Communicator) initEngine(ctx context.Context) error {
	g := c.gpu
	if c.nodes == 1 {
		if g.node != nil {
			g.eng = llEngine{c}
		} else {
			g.eng = hostStagedEngine{c}
		}
		return nil
	}
	across, err := c.initAcross(ctx)
	if err != nil {
		return err
	}
	g.eng = hostStagedEngine{c}
	if across != nil {
		g.eng = across
	}
	team, err := c.initTeam(ctx)
	if err != nil {
		return err
	}
	if team != nil {
		g.eng = nvEngine{c: c, team: team, other: g.eng}
	}
	return nil
}

// initAcross sets up the all-gather of device memory across nodes: the
// algorithm of the host engine (hier or the ring), written once in package
// inter, over the node's LL group and a TCP transport of its own whose
// blocks are staged through pinned host memory. Every rank decides alike:
// the algorithm is the job's, and P2P within a node is the node's verdict
// (hier needs the LL group; without it GPU plans stage through the host
// engine).
func (c *Communicator) initAcross(ctx context.Context) (*acrossEngine, error) {
	g, o := c.gpu, c.opts
	if o.Algo != "ring" && g.node == nil {
		return nil, nil
	}
	t, err := c.dialNodes(ctx, "gpunet")
	if err != nil {
		return nil, err
	}
	link, err := inter.NewStaged(t, g.dev)
	if err != nil {
		t.Close()
		return nil, err
	}
	e := &acrossEngine{c: c, link: link}
	if o.Algo == "ring" {
		e.algo = ringEngine[intra.DevSpan]{inter.NewRingOver[intra.DevSpan](link, o.WorldSize, o.Rank, o.Timeout)}
		return e, nil
	}
	if e.gnode, err = g.node.Node(); err != nil {
		e.close()
		return nil, err
	}
	e.algo = hierEngine[intra.DevSpan]{inter.NewHierOver[intra.DevSpan](e.gnode, link, c.nodes, o.LocalWorldSize, o.Rank, o.Timeout)}
	return e, nil
}

// initTeam joins NVSHMEM across nodes where every rank can: its library
// loads on every rank, and no two ranks share a process (NVSHMEM is one
// PE per process). The ranks decide together, through the store, so that
// all of them use NVSHMEM or none.
func (c *Communicator) initTeam(ctx context.Context) (*nvshmem.Team, error) {
	o := c.opts
	_, libErr := kernels.OpenNVSHMEM()
	key := func(r int) string { return c.key("nvshmem-able/" + strconv.Itoa(r)) }
	host, _ := os.Hostname() // pids repeat across machines
	if err := c.store.Set(ctx, key(o.Rank), []byte(fmt.Sprintf("%s/%d %t", host, os.Getpid(), libErr == nil))); err != nil {
		return nil, fault.New("init", o.Rank, -1, ErrTimeout, "publishing NVSHMEM readiness: %v", err)
	}
	var why error // why there is no team
	procs := map[string]bool{}
	for r := range o.WorldSize {
		v, err := c.store.Get(ctx, key(r))
		if err != nil {
			return nil, fault.New("init", o.Rank, r, ErrTimeout, "waiting for the peer's NVSHMEM readiness: %v", err)
		}
		proc, able, _ := strings.Cut(string(v), " ")
		switch {
		case able != "true":
			why = fmt.Errorf("%w: rank %d cannot load libslimenvshmem.so", kernels.ErrNotFound, r)
		case procs[proc]:
			why = fmt.Errorf("%w: ranks share a process, and NVSHMEM takes one per process", kernels.ErrNotFound)
		}
		procs[proc] = true
	}
	if why != nil {
		return nil, nil // the engine chosen without it
	}
	team, err := nvshmem.Bootstrap(ctx, c.store, c.key("nvshmem"), c.gpu.dev, o.Rank, o.WorldSize, o.Timeout)
	if err != nil && !errors.Is(err, kernels.ErrNotFound) {
		return nil, err
	}
	return team, nil
}

// noP2P makes nodeP2P answer that the node's GPUs cannot reach each
// other: the tests' way to the host-staged engine on one GPU (or the
// emulator). Set it only while no communicator is being made.
var noP2P atomic.Bool

// nodeP2P exchanges the node's GPUs' PCI addresses and asks NVML whether
// every pair can read each other's memory (true where NVML cannot say: the
// CUDA IPC mapping then decides).
func (c *Communicator) nodeP2P(ctx context.Context, lay layout, dev *device.GPU) (bool, error) {
	members := lay.members[lay.myNode]
	key := func(l int) string { return c.key("gpubus" + strconv.Itoa(lay.myNode) + "/" + strconv.Itoa(l)) }
	if err := c.store.Set(ctx, key(c.opts.LocalRank), []byte(dev.BusID)); err != nil {
		return false, fault.New("init", c.opts.Rank, -1, ErrTimeout, "publishing the GPU's PCI address: %v", err)
	}
	buses := make([]string, len(members))
	distinct := map[string]bool{}
	for l := range members {
		v, err := c.store.Get(ctx, key(l))
		if err != nil {
			return false, fault.New("init", c.opts.Rank, members[l], ErrTimeout, "waiting for the peer's GPU PCI address: %v", err)
		}
		buses[l] = string(v)
		distinct[buses[l]] = true
	}
	if noP2P.Load() {
		return false, nil
	}
	if len(distinct) < 2 {
		return true, nil
	}
	top, err := topology.Read()
	if err != nil || top.NVMLErr != nil {
		return true, nil
	}
	return top.P2P(buses), nil
}

func (c *Communicator) describeBackend() string {
	g := c.gpu
	if g == nil {
		return "cpu"
	}
	s := "cuda " + g.dev.String()
	if g.node == nil {
		s += " within the node: host-staged (no P2P between its GPUs)"
	}
	if d := g.eng.describe(); d != "" {
		s += " across nodes: " + d
	}
	return s
}

func (c *Communicator) closeGPU() {
	g := c.gpu
	if g == nil {
		return
	}
	c.gpu = nil
	ctx, cancel := context.WithTimeout(context.Background(), min(c.opts.Timeout, 10*time.Second))
	defer cancel()
	if g.stream != nil {
		g.stream.Synchronize(ctx)
	}
	// The engine first (the staged link's pinned buffers, stream and TCP
	// connections; the NVSHMEM team), then the LL group, then the stream.
	if g.eng != nil {
		g.eng.close()
	}
	if g.node != nil {
		g.node.Close(ctx)
	}
	if g.stream != nil {
		g.stream.Close()
	}
}

// Backend is the backend the communicator runs on: device.CUDA where
// Init opened a GPU, device.CPU otherwise. Host-memory collectives
// (AllGather on byte slices) work on both.
func (c *Communicator) Backend() device.Kind {
	if c.gpu != nil {
		return device.CUDA
	}
	return device.CPU
}

// gpuPlan is a Plan's engine for device memory: one planned all-gather
// of the communicator's devEngine.
type gpuPlan struct {
	c      *Communicator
	op     devPlanned
	closed bool
}

// planGPU prepares PlanBuffers on the CUDA backend: an all-gather of
// equal blocks of device memory, src (this rank's block) landing at
// Rank()·len(src) of dst on every rank. Within a node the plan runs the
// LL kernel, captured into a CUDA graph on its first Run unless
// Options.Eager; across nodes it runs the NVSHMEM kernel where
// libslimenvshmem.so is present, otherwise the job's algorithm (hier or
// the ring) over the node's LL group and TCP, blocks staged through pinned
// host memory. A plan across nodes without NVSHMEM is synchronous: each
// Launch waits for the work already on Stream(), gathers, and returns
// once dst is complete (it cannot be captured into a CUDA graph).
func (c *Communicator) planGPUEqual(ctx context.Context, dst, src *device.CUDABuffer) (*Plan, error) {
	if err := c.gpuOnly("allgather"); err != nil {
		return nil, err
	}
	if dst.Len < c.Size()*src.Len {
		return nil, fault.New("allgather", c.Rank(), -1, ErrInvalid, "dst holds %d bytes, %d ranks × %d need %d", dst.Len, c.Size(), src.Len, c.Size()*src.Len)
	}
	counts := make([]int, c.Size())
	for i := range counts {
		counts[i] = src.Len
	}
	return c.planGPU(ctx, "allgather", dst, src, counts, packed(counts))
}

// planGPUV is PlanBuffersV on the CUDA backend.
func (c *Communicator) planGPUV(ctx context.Context, dst, src *device.CUDABuffer, counts []int) (*Plan, error) {
	if err := c.gpuOnly("allgatherv"); err != nil {
		return nil, err
	}
	if len(counts) != c.Size() {
		return nil, fault.New("allgatherv", c.Rank(), -1, ErrInvalid, "%d counts for %d ranks", len(counts), c.Size())
	}
	total := 0
	for _, n := range counts {
		if n < 0 {
			return nil, fault.New("allgatherv", c.Rank(), -1, ErrInvalid, "negative count %d", n)
		}
		if n > dst.Len-total { // not total+n > dst.Len, which may wrap
			return nil, fault.New("allgatherv", c.Rank(), -1, ErrInvalid, "dst holds %d bytes, less than the counts %v add up to", dst.Len, counts)
		}
		total += n
	}
	if counts[c.Rank()] != src.Len || dst.Len < total {
		return nil, fault.New("allgatherv", c.Rank(), -1, ErrInvalid, "src holds %d bytes (counts say %d), dst %d of %d needed", src.Len, counts[c.Rank()], dst.Len, total)
	}
	return c.planGPU(ctx, "allgatherv", dst, src, counts, packed(counts))
}

// planGPUBlocks is PlanBuffersBlocks on the CUDA backend.
func (c *Communicator) planGPUBlocks(ctx context.Context, dst, src *device.CUDABuffer, sizes, offs []int) (*Plan, error) {
	if err := c.gpuOnly("allgatherv"); err != nil {
		return nil, err
	}
	if len(sizes) != c.Size() || len(offs) != c.Size() {
		return nil, fault.New("allgatherv", c.Rank(), -1, ErrInvalid, "%d sizes and %d offsets for %d ranks", len(sizes), len(offs), c.Size())
	}
	for r := range sizes {
		if !blockIn(sizes[r], offs[r], dst.Len) {
			return nil, fault.New("allgatherv", c.Rank(), -1, ErrInvalid, "rank %d's block [%d, +%d) is not in dst's %d bytes", r, offs[r], sizes[r], dst.Len)
		}
	}
	if err := checkOverlap("allgatherv", c.Rank(), dst.Len, sizes, offs); err != nil {
		return nil, err
	}
	if sizes[c.Rank()] != src.Len {
		return nil, fault.New("allgatherv", c.Rank(), -1, ErrInvalid, "src holds %d bytes, sizes say %d", src.Len, sizes[c.Rank()])
	}
	return c.planGPU(ctx, "allgatherv", dst, src, slices.Clone(sizes), slices.Clone(offs))
}

func (c *Communicator) gpuOnly(op string) error {
	if c.gpu == nil {
		return fault.New(op, c.Rank(), -1, ErrInvalid, "the communicator runs on the CPU backend (Backend() is cpu)")
	}
	return nil
}

// planGPU plans on the engine once the buffers are checked against what
// the kernels and copies assume: both on the communicator's GPU (another
// device's memory faults in its kernels), and src either this rank's own
// block of dst (in place) or apart from dst (the kernels gather into dst
// while later rounds, or other blocks of the grid, still read src).
func (c *Communicator) planGPU(ctx context.Context, name string, dst, src *device.CUDABuffer, counts, offs []int) (*Plan, error) {
	me := c.gpu.dev.Ordinal
	if dst.Freed() || src.Freed() {
		return nil, fault.New(name, c.Rank(), -1, ErrInvalid, "dst or src has been freed")
	}
	for _, b := range []struct {
		what string
		buf  *device.CUDABuffer
	}{{"dst", dst}, {"src", src}} {
		if b.buf.Dev == nil || b.buf.Dev.Ordinal != me {
			where := "no device"
			if b.buf.Dev != nil {
				where = fmt.Sprintf("device %d", b.buf.Dev.Ordinal)
			}
			return nil, fault.New(name, c.Rank(), -1, ErrInvalid, "%s is memory of %s; the communicator runs on device %d", b.what, where, me)
		}
	}
	if src.Len > 0 && dst.Len > 0 {
		own := dst.Ptr + kernels.Ptr(offs[c.Rank()])
		s0, s1, d0, d1 := src.Ptr, src.Ptr+kernels.Ptr(src.Len), dst.Ptr, dst.Ptr+kernels.Ptr(dst.Len)
		if s0 != own && s0 < d1 && d0 < s1 {
			return nil, fault.New(name, c.Rank(), -1, ErrInvalid, "src overlaps dst other than at this rank's own block (offset %d)", offs[c.Rank()])
		}
	}
	op, err := c.gpu.eng.plan(ctx, dst, src, counts, offs)
	if err != nil {
		return nil, err
	}
	// A run over memory freed since would replay the kernels (or stage
	// the copies) into whatever lies there now: refused, as for a plan
	// over a freed symmetric buffer.
	freed := func() error {
		if dst.Freed() || src.Freed() {
			return fault.New(name, c.Rank(), -1, ErrInvalid, "the plan's dst or src has been freed")
		}
		return nil
	}
	return &Plan{c: c, eng: &gpuPlan{c: c, op: op}, freed: freed}, nil
}

func (p *gpuPlan) mode() string { return p.op.mode() }

func (p *gpuPlan) launch(ctx context.Context) error {
	if p.c.gpu == nil || p.closed {
		return p.c.closedErr("allgather")
	}
	return p.op.launch(ctx)
}

func (p *gpuPlan) wait(ctx context.Context) error {
	if p.c.gpu == nil || p.closed {
		return p.c.closedErr("allgather")
	}
	return p.op.wait(ctx)
}

func (p *gpuPlan) close() error {
	if p.closed {
		return nil
	}
	p.closed = true
	return p.op.close()
}

// check reports an earlier failure (closed), or what the node's kernels
// saw, which breaks the GPU path.
func (g *gpuState) check() error {
	if g.broken != nil {
		return g.closed()
	}
	if g.node != nil {
		if err := g.node.Check("allgather"); err != nil {
			g.broken = err
			return err
		}
	}
	return nil
}

// closed is what a call returns once the GPU path broke: ErrClosed,
// saying what broke it, as the CPU path's later calls do. The call that
// met the failure returned the failure itself.
func (g *gpuState) closed() error {
	return fault.New("communicator", g.rank, -1, ErrClosed, "broken by an earlier error: %v", g.broken)
}

// syncGPU is Synchronize on the CUDA backend: it waits, within the
// communicator's timeout, for the work enqueued on s, then reports what
// the node's kernels saw (a peer that did not arrive is an *OpError
// naming it).
func (c *Communicator) syncGPU(ctx context.Context, op string, s *device.CUDAStream) error {
	g := c.gpu
	if g == nil {
		return c.closedErr(op)
	}
	if g.broken != nil {
		return g.closed()
	}
	if err := c.syncStream(ctx, op, s); err != nil {
		return err
	}
	return g.check()
}

// syncStream waits for s within the communicator's timeout. The kernels
// give up after the timeout; the host waits a little longer, so that their
// own report, naming the peer, comes first. A wait that gives up breaks
// the GPU path. It allocates nothing.
func (c *Communicator) syncStream(ctx context.Context, op string, s *device.CUDAStream) error {
	if err := s.SynchronizeBy(ctx, time.Now().Add(c.opts.Timeout).Add(5*time.Second)); err != nil { // no sum to overflow
		// A cancelled ctx is reported as such (as on the CPU, streamErr),
		// not as a timeout.
		kind := ErrTimeout
		if errors.Is(err, context.Canceled) {
			kind = context.Canceled
		}
		c.gpu.broken = fault.New(op, c.Rank(), -1, kind, "%v", err)
		return c.gpu.broken
	}
	return nil
}
