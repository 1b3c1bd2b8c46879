package collective

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/slimego/slimego/cudagraph"
	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/inter"
	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/intra"
	"github.com/slimego/slimego/kernels"
	"github.com/slimego/slimego/nvshmem"
	"github.com/slimego/slimego/topology"
)

// gpuState is a communicator's CUDA backend: its GPU, the stream its
// collectives run on, the node's LL all-gather group and, across nodes,
// the all-gather of device memory chosen at Init (hier or the ring over
// host-staged TCP) and, where libslimenvshmem.so is present, the NVSHMEM
// team.
type gpuState struct {
	dev     *device.GPU
	stream  *device.CUDAStream
	node    *intra.GPUGroup
	team    *nvshmem.Team
	teamErr error // why there is no team, across nodes
	broken  error // a failure after which the GPU path cannot go on

	// across is the algorithm across nodes over device spans: the node's
	// LL group (gnode) and the staged link for hier, the link alone for
	// the ring. nil on one node, and under hier where the node's GPUs
	// cannot reach each other (plans then stage through the host engine).
	across engine[intra.DevSpan]
	gnode  *intra.GPUNode
	link   *inter.Staged
}

// initGPU opens GPU LOCAL_RANK mod the number of GPUs (several ranks may
// share one) and sets up the node's GPU group.
func (c *Communicator) initGPU(ctx context.Context, lay layout) error {
	o := c.opts
	n, err := device.CUDADeviceCount()
	if err != nil {
		return fault.New("init", o.Rank, -1, ErrInvalid, "cuda: %v", err)
	}
	dev, err := device.OpenGPU(o.LocalRank % n)
	if err != nil {
		return fault.New("init", o.Rank, -1, ErrInvalid, "%v", err)
	}
	g := &gpuState{dev: dev}
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
			Dev: dev, Cap: o.GPUScratch, Timeout: o.Timeout,
		}) // otherwise g.node stays nil: node-local data goes through the host
		if err != nil {
			return err
		}
	}
	if err := c.initAcross(ctx); err != nil {
		return err
	}
	return c.initTeam(ctx)
}

// initAcross sets up the all-gather of device memory across nodes: the
// algorithm of the host engine (hier or the ring), written once in package
// inter, over the node's LL group and a TCP transport of its own whose
// blocks are staged through pinned host memory. Every rank decides alike:
// the algorithm is the job's, and P2P within a node is the node's verdict
// (hier needs the LL group; without it GPU plans stage through the host
// engine).
func (c *Communicator) initAcross(ctx context.Context) error {
	g, o := c.gpu, c.opts
	if c.nodes == 1 || (o.Algo != "ring" && g.node == nil) {
		return nil
	}
	t, err := c.dialNodes(ctx, "gpunet")
	if err != nil {
		return err
	}
	link, err := inter.NewStaged(t, g.dev)
	if err != nil {
		t.Close()
		return err
	}
	g.link = link
	if o.Algo == "ring" {
		g.across = ringEngine[intra.DevSpan]{inter.NewRingOver[intra.DevSpan](link, o.WorldSize, o.Rank, o.Timeout)}
		return nil
	}
	if g.gnode, err = g.node.Node(); err != nil {
		return err
	}
	g.across = hierEngine[intra.DevSpan]{inter.NewHierOver[intra.DevSpan](g.gnode, link, c.nodes, o.LocalWorldSize, o.Rank, o.Timeout)}
	return nil
}

// initTeam joins NVSHMEM across nodes where every rank can: its library
// loads on every rank, and no two ranks share a process (NVSHMEM is one
// PE per process). The ranks decide together, through the store, so that
// all of them use NVSHMEM or none.
func (c *Communicator) initTeam(ctx context.Context) error {
	g, o := c.gpu, c.opts
	if c.nodes == 1 {
		return nil
	}
	_, libErr := kernels.OpenNVSHMEM()
	key := func(r int) string { return c.key("nvshmem-able/" + strconv.Itoa(r)) }
	host, _ := os.Hostname() // pids repeat across machines
	if err := c.store.Set(ctx, key(o.Rank), []byte(fmt.Sprintf("%s/%d %t", host, os.Getpid(), libErr == nil))); err != nil {
		return fault.New("init", o.Rank, -1, ErrTimeout, "publishing NVSHMEM readiness: %v", err)
	}
	procs := map[string]bool{}
	for r := range o.WorldSize {
		v, err := c.store.Get(ctx, key(r))
		if err != nil {
			return fault.New("init", o.Rank, r, ErrTimeout, "waiting for the peer's NVSHMEM readiness: %v", err)
		}
		proc, able, _ := strings.Cut(string(v), " ")
		switch {
		case able != "true":
			g.teamErr = fmt.Errorf("%w: rank %d cannot load libslimenvshmem.so", kernels.ErrNotFound, r)
		case procs[proc]:
			g.teamErr = fmt.Errorf("%w: ranks share a process, and NVSHMEM takes one per process", kernels.ErrNotFound)
		}
		procs[proc] = true
	}
	if g.teamErr != nil {
		return nil // host-staged across nodes
	}
	g.team, g.teamErr = nvshmem.Bootstrap(ctx, c.store, c.key("nvshmem"), g.dev, o.Rank, o.WorldSize, o.Timeout)
	if g.teamErr != nil && !errors.Is(g.teamErr, kernels.ErrNotFound) {
		return g.teamErr
	}
	return nil
}

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
	if c.gpu == nil {
		return "cpu"
	}
	s := "cuda " + c.gpu.dev.String()
	if c.gpu.node == nil {
		s += " within the node: host-staged (no P2P between its GPUs)"
	}
	if c.nodes > 1 {
		if c.gpu.team != nil {
			s += " across nodes: nvshmem"
			if c.gpu.across != nil {
				s += ", otherwise " + c.opts.Algo + " over host-staged tcp"
			}
		} else if c.gpu.across != nil {
			s += " across nodes: " + c.opts.Algo + " over host-staged tcp"
		} else {
			s += " across nodes: host-staged tcp"
		}
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
	// The staged link first (its pinned buffers, its stream, its TCP
	// connections), then the node's stream, then the LL group.
	if g.link != nil {
		g.link.Close()
	}
	if g.gnode != nil {
		g.gnode.Close()
	}
	if g.node != nil {
		g.node.Close(ctx)
	}
	if g.team != nil {
		g.team.Close()
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

// GPU is the communicator's GPU, nil on the CPU backend.
func (c *Communicator) GPU() *device.GPU {
	if c.gpu == nil {
		return nil
	}
	return c.gpu.dev
}

// GPUStream is the stream the communicator's GPU collectives run on; work
// that consumes their results can be ordered after them with an event.
func (c *Communicator) GPUStream() *device.CUDAStream {
	if c.gpu == nil {
		return nil
	}
	return c.gpu.stream
}

// gpuPlan is a Plan's engine for device memory: the node's LL kernel, the
// NVSHMEM kernel across nodes, the communicator's algorithm across nodes
// over device memory (across), or host staging through a host Plan.
type gpuPlan struct {
	c      *Communicator
	runner *cudagraph.Runner
	node   *intra.GPUPlan
	nv     *nvshmem.AllGather
	// across nodes, synchronous: launch waits for the communicator's
	// stream, runs the op (hier or the ring over the staged link) and
	// returns when dst is complete.
	across planned[intra.DevSpan]
	// host-staged: src to hostSrc, the host plan gathers into hostD
	// (blocks packed in rank order), and each piece of hostD goes back to
	// its place in dst.
	host    *Plan
	hostSrc []byte
	hostD   []byte
	src     *device.CUDABuffer
	back    []*device.CUDABuffer // where hostD's pieces go
	backOff []int                // and where each starts in hostD
	closed  bool
}

// PlanGPU prepares an all-gather of equal blocks of device memory (a
// collective call, as is the plan's Close): src
// (this rank's block) lands at Rank()·len(src) of dst on every rank. dst
// and src are any memory of the communicator's GPU; in place (src inside
// dst at this rank's offset) works. Within a node the plan runs the LL
// kernel, captured into a CUDA graph on its first Run unless
// Options.Eager; across nodes it runs the NVSHMEM kernel where
// libslimenvshmem.so is present, otherwise the job's algorithm (hier or
// the ring) over the node's LL group and TCP, blocks staged through pinned
// host memory. A plan across nodes without NVSHMEM is synchronous: each
// Launch waits for the work already on GPUStream(), gathers, and returns
// once dst is complete (it cannot be captured into a CUDA graph).
func (c *Communicator) PlanGPU(ctx context.Context, dst, src *device.CUDABuffer) (*Plan, error) {
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
	return c.planGPU(ctx, dst, src, counts, packed(counts))
}

// PlanGPUV is PlanGPU with counts[r] bytes from rank r, packed in rank
// order; every rank passes the same counts.
func (c *Communicator) PlanGPUV(ctx context.Context, dst, src *device.CUDABuffer, counts []int) (*Plan, error) {
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
		total += n
	}
	if counts[c.Rank()] != src.Len || dst.Len < total {
		return nil, fault.New("allgatherv", c.Rank(), -1, ErrInvalid, "src holds %d bytes (counts say %d), dst %d of %d needed", src.Len, counts[c.Rank()], dst.Len, total)
	}
	return c.planGPU(ctx, dst, src, counts, packed(counts))
}

// PlanGPUBlocks is PlanBlocks on device memory: rank r's sizes[r] bytes
// land at offs[r] of dst on every rank, src being this rank's block. Every
// rank passes the same sizes. Package overlap gathers a matrix's rows
// piece by piece with it.
func (c *Communicator) PlanGPUBlocks(ctx context.Context, dst, src *device.CUDABuffer, sizes, offs []int) (*Plan, error) {
	if err := c.gpuOnly("allgatherv"); err != nil {
		return nil, err
	}
	if len(sizes) != c.Size() || len(offs) != c.Size() {
		return nil, fault.New("allgatherv", c.Rank(), -1, ErrInvalid, "%d sizes and %d offsets for %d ranks", len(sizes), len(offs), c.Size())
	}
	for r := range sizes {
		if sizes[r] < 0 || offs[r] < 0 || offs[r]+sizes[r] > dst.Len {
			return nil, fault.New("allgatherv", c.Rank(), -1, ErrInvalid, "rank %d's block [%d, +%d) is not in dst's %d bytes", r, offs[r], sizes[r], dst.Len)
		}
	}
	if sizes[c.Rank()] != src.Len {
		return nil, fault.New("allgatherv", c.Rank(), -1, ErrInvalid, "src holds %d bytes, sizes say %d", src.Len, sizes[c.Rank()])
	}
	return c.planGPU(ctx, dst, src, slices.Clone(sizes), slices.Clone(offs))
}

// packed is the offsets of blocks of counts bytes one after another.
func packed(counts []int) []int {
	offs := make([]int, len(counts))
	for r := 1; r < len(counts); r++ {
		offs[r] = offs[r-1] + counts[r-1]
	}
	return offs
}

func (c *Communicator) gpuOnly(op string) error {
	if c.gpu == nil {
		return fault.New(op, c.Rank(), -1, ErrInvalid, "the communicator runs on the CPU backend (Backend() is cpu)")
	}
	return nil
}

func (c *Communicator) planGPU(ctx context.Context, dst, src *device.CUDABuffer, counts, offs []int) (*Plan, error) {
	g := c.gpu
	p := &gpuPlan{c: c, src: src}
	uniform := true
	for _, n := range counts {
		uniform = uniform && n == counts[0]
	}
	var launch cudagraph.Launcher
	switch {
	case c.nodes == 1 && g.node != nil:
		np, err := g.node.Plan(dst.Ptr, src.Ptr, counts, offs)
		if err != nil {
			return nil, err
		}
		p.node, launch = np, np.Launch
	case g.team != nil && uniform && slices.Equal(offs, packed(counts)):
		nv, err := g.team.Plan(ctx, src.Ptr, dst.Ptr, counts[0])
		if err != nil {
			return nil, err
		}
		p.nv, launch = nv, nv.Launch
	case c.nodes > 1 && g.across != nil:
		if err := g.check(); err != nil {
			return nil, err
		}
		op, err := g.across.Plan("allgather", intra.Span(dst), intra.Span(src), counts, offs)
		if err != nil {
			return nil, err
		}
		p.across = op
		// As below: every rank finishes planning (the LL group's
		// allocations) before any runs.
		if err := c.Barrier(ctx); err != nil {
			return nil, err
		}
		return &Plan{c: c, eng: p}, nil
	default:
		if err := p.stageThroughHost(dst, counts, offs); err != nil {
			return nil, err
		}
		return &Plan{c: c, eng: p}, nil
	}
	p.runner = cudagraph.New(g.stream, c.opts.Eager || cudagraph.Eager(), launch)
	// cudaMalloc and cudaFree may wait for the whole device: a rank still
	// allocating while a peer's kernel already waits for it would stall
	// both. Every rank finishes planning before any runs.
	if err := c.Barrier(ctx); err != nil {
		return nil, err
	}
	return &Plan{c: c, eng: p}, nil
}

// stageThroughHost plans the GPU block to host memory, the CPU backend's
// all-gather (across nodes, or within a node whose GPUs cannot reach each
// other), and the result back to dst: in one copy where the blocks are
// packed, block by block otherwise.
func (p *gpuPlan) stageThroughHost(dst *device.CUDABuffer, counts, offs []int) error {
	c := p.c
	pk := packed(counts)
	total := pk[len(pk)-1] + counts[len(counts)-1]
	p.hostSrc = make([]byte, p.src.Len)
	p.hostD = make([]byte, total)
	hp, err := c.PlanV(p.hostD, p.hostSrc, counts)
	if err != nil {
		return err
	}
	p.host = hp
	if slices.Equal(offs, pk) {
		whole, err := dst.Slice(0, total)
		if err != nil {
			return fault.New("allgather", c.Rank(), -1, ErrInvalid, "%v", err)
		}
		p.back, p.backOff = []*device.CUDABuffer{whole}, []int{0}
		return nil
	}
	for r := range counts {
		if counts[r] == 0 {
			continue
		}
		b, err := dst.Slice(offs[r], counts[r])
		if err != nil {
			return fault.New("allgather", c.Rank(), -1, ErrInvalid, "%v", err)
		}
		p.back, p.backOff = append(p.back, b), append(p.backOff, pk[r])
	}
	return nil
}

func (p *gpuPlan) mode() string {
	if p.across != nil {
		return "staged"
	}
	if p.runner == nil {
		return "host-staged"
	}
	return p.runner.Mode()
}

func (p *gpuPlan) launch(ctx context.Context) error {
	if p.c.gpu == nil || p.closed {
		return p.c.closedErr("allgather")
	}
	if p.across != nil {
		return p.runAcross(ctx)
	}
	if p.runner == nil {
		return p.runHost(ctx)
	}
	if err := p.c.gpu.check(); err != nil {
		return err
	}
	if err := p.runner.Run(); err != nil {
		return fault.New("allgather", p.c.Rank(), -1, err, "launch (%s mode)", p.runner.Mode())
	}
	return nil
}

func (p *gpuPlan) wait(ctx context.Context) error {
	g := p.c.gpu
	if g == nil || p.closed {
		return p.c.closedErr("allgather")
	}
	if p.runner == nil {
		return nil // host-staged or across: launch ran to completion
	}
	if err := p.c.syncStream(ctx, "allgather", g.stream); err != nil {
		return err
	}
	if p.nv != nil {
		if err := p.nv.Check(); err != nil {
			g.broken = err
			return err
		}
	}
	return g.check()
}

// check reports an earlier failure, or what the node's kernels saw.
func (g *gpuState) check() error {
	if g.broken != nil {
		return g.broken
	}
	if g.node != nil {
		return g.node.Check("allgather")
	}
	return nil
}

// runAcross runs the algorithm across nodes over device memory: once the
// work enqueued on the communicator's stream (which may write src) is
// done, since the node's kernels and the link's copies run on streams of
// their own. Any failure breaks the GPU path: a size mismatch leaves the
// LL group at another epoch than its peers (hier), and a lost or late peer
// leaves blocks in flight; later calls return the same error.
func (p *gpuPlan) runAcross(ctx context.Context) error {
	g := p.c.gpu
	if err := g.check(); err != nil {
		return err
	}
	if err := p.c.syncStream(ctx, "allgather", g.stream); err != nil {
		return err
	}
	if err := p.across.Run(ctx); err != nil {
		g.broken = err
		return err
	}
	return nil
}

func (p *gpuPlan) runHost(ctx context.Context) error {
	if err := p.src.CopyToHost(p.hostSrc); err != nil {
		return fault.New("allgather", p.c.Rank(), -1, err, "staging to the host")
	}
	// The host plan's engine directly: the caller (Plan.Launch) records
	// the failure for the launcher, once.
	if err := p.host.eng.launch(ctx); err != nil {
		return err
	}
	if err := p.host.eng.wait(ctx); err != nil {
		return err
	}
	for i, b := range p.back {
		if err := b.CopyFromHost(p.hostD[p.backOff[i] : p.backOff[i]+b.Len]); err != nil {
			return fault.New("allgather", p.c.Rank(), -1, err, "staging from the host")
		}
	}
	return nil
}

func (p *gpuPlan) close() error {
	if p.closed {
		return nil
	}
	p.closed = true
	var errs []error
	if g := p.c.gpu; g != nil && g.broken == nil && (p.runner != nil || p.across != nil) {
		ctx, cancel := context.WithTimeout(context.Background(), p.c.opts.Timeout)
		errs = append(errs, p.c.Barrier(ctx))
		cancel()
	}
	if p.runner != nil {
		errs = append(errs, p.runner.Close())
	}
	if p.nv != nil {
		errs = append(errs, p.nv.Close())
	}
	return errors.Join(errs...)
}

// SyncGPU waits, within the communicator's timeout, for the work enqueued
// on s, then reports what the node's kernels saw (a peer that did not
// arrive is an *OpError naming it): for operators that order their own
// GPU work after the communicator's plans (package overlap).
func (c *Communicator) SyncGPU(ctx context.Context, op string, s *device.CUDAStream) error {
	g := c.gpu
	if g == nil {
		return c.closedErr(op)
	}
	if g.broken != nil {
		return g.broken
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
	if err := s.SynchronizeBy(ctx, time.Now().Add(c.opts.Timeout+5*time.Second)); err != nil {
		c.gpu.broken = fault.New(op, c.Rank(), -1, ErrTimeout, "%v", err)
		return c.gpu.broken
	}
	return nil
}
