package collective

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/inter"
	"github.com/slimego/slimego/internal/auth"
	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/internal/machine"
	"github.com/slimego/slimego/internal/netaddr"
	"github.com/slimego/slimego/internal/shm"
	"github.com/slimego/slimego/intra"
	"github.com/slimego/slimego/kernels"
	"github.com/slimego/slimego/rendezvous"
)

// The errors of every operation; see [OpError].
var (
	ErrTimeout      = fault.ErrTimeout
	ErrPeerLost     = fault.ErrPeerLost
	ErrSizeMismatch = fault.ErrSizeMismatch
	ErrClosed       = fault.ErrClosed
	ErrInvalid      = fault.ErrInvalid
)

// ErrPlanClosed is the error (errors.Is ErrClosed too) of a call through
// a plan that Plan.Close has closed: the communicator itself is open, and
// a new plan runs the call.
var ErrPlanClosed error = planClosed{}

type planClosed struct{}

func (planClosed) Error() string { return "slimego: plan closed" }
func (planClosed) Unwrap() error { return ErrClosed }

// OpError names the operation, the rank and the peer (-1 for none) of a
// failure, and wraps one of the errors above.
type OpError = fault.OpError

// DefaultTimeout bounds every wait unless Options.Timeout or SLIME_TIMEOUT
// says otherwise.
const DefaultTimeout = 5 * time.Minute

// Communicator is one rank's membership in a job. Its methods are not safe
// for concurrent use: like a stream, one goroutine drives it. A call made
// while another goroutine's is in progress is refused (ErrInvalid), and
// Close waits for the call in progress to return.
type Communicator struct {
	// busy is idle (0), in a call (1) or closed (2): enter and leave.
	busy   atomic.Int32
	opts   Options
	store  *rendezvous.Client
	server *rendezvous.Server
	nodes  int
	// node is the shared-memory group: the symmetric memory of Alloc, and
	// the node-local half of eng.
	node *intra.Group
	// net is the TCP transport across nodes, nil on one node.
	net *inter.Transport
	// eng is the host all-gather chosen at Init (the node's group, hier or
	// the ring): every host plan and barrier goes through it. nil once
	// closed.
	eng engine[[]byte]

	// the CUDA backend's state; nil on the CPU
	gpu *gpuState
	// stream is Stream() on the CPU backend (nil on CUDA, and once
	// closed): buffer plans are ordered on it.
	stream *device.CPUStream

	// scratch for the one-shot calls, so that they allocate nothing
	oneShot  planned[[]byte] // AllGather's
	oneShotV planned[[]byte] // AllGatherV's
	refusal  planned[[]byte] // a call this rank refused (refuse)
	sizes    []int
	offs     []int
	// id is the communicator's identity among the process's open ones
	// (claim); "" once closed. scope names its store keys and
	// shared memory: Options.Name, and its generation after the first.
	id, scope string
	// mismatches counts the calls whose ranks disagreed (explain): the
	// same on every rank, it keys their exchange in the store.
	mismatches int
}

// Init joins the job described by opts, filling what opts leaves zero from
// the environment ([LoadEnv]). It returns once every rank of the node has
// joined, or an error naming what is missing when the deadline (the
// context's, or Timeout) passes.
func Init(ctx context.Context, opts Options) (*Communicator, error) {
	env, err := envOptions()
	if err != nil && opts.WorldSize == 0 {
		return nil, err
	}
	o := merge(opts, env)
	// The claim comes first: an Init that fails on a bad option here
	// counts as a generation as one that fails later does (on the ranks
	// that waited for this one), so that all meet at the next Init.
	id, gen, err := claim(o)
	if err != nil {
		return nil, err
	}
	if err := o.validate(); err != nil {
		release(id)
		return nil, err
	}
	kind, err := device.Resolve(o.Backend)
	if err != nil {
		release(id)
		return nil, fault.New("init", o.Rank, -1, ErrInvalid, "%v", err)
	}
	// Options.Timeout bounds Init's waits, or the context's deadline where
	// that comes first (WithTimeout keeps the earlier), as it bounds every
	// operation's.
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	c := &Communicator{opts: o, id: id, scope: scope(o.Name, gen)}
	if err := c.init(ctx, kind); err != nil {
		err = c.failed(c.initFault(err))
		c.Close()
		return nil, err
	}
	return c, nil
}

// initFault names the cause of an Init failure that came from the store
// (see storeFault); other errors are already specific.
func (c *Communicator) initFault(err error) error {
	var ae *rendezvous.AbortError
	if errors.As(err, &ae) || errors.Is(err, rendezvous.ErrConnLost) || errors.Is(err, rendezvous.ErrDenied) || errors.Is(err, rendezvous.ErrBadAnswer) {
		return c.storeFault("init", err, -1, "joining the job")
	}
	return err
}

// init does Init's work; on an error the caller closes c.
func (c *Communicator) init(ctx context.Context, kind device.Kind) error {
	o := c.opts
	if err := c.connect(ctx); err != nil {
		return err
	}
	lay, err := c.exchangeLayout(ctx, kind)
	if err != nil {
		return err
	}
	c.nodes = len(lay.members)
	c.opts.NodeRank = lay.myNode // the node's index, whatever labels the launcher gave
	if c.opts.Algo, err = chooseAlgo(o, lay); err != nil {
		return err
	}
	o = c.opts
	cpus := machine.OnlineCPUs()
	node, err := intra.New(ctx, intra.Config{
		Store:       c.store,
		Key:         c.key("node" + strconv.Itoa(lay.myNode)),
		ShmPrefix:   shm.JobPrefix(o.attemptID()) + c.scope + "-",
		Rank:        o.LocalRank,
		Size:        o.LocalWorldSize,
		Ranks:       lay.members[lay.myNode],
		Timeout:     o.Timeout,
		SlotBytes:   o.SlotBytes,
		Slots:       o.Slots,
		ZeroCopyMin: o.ZeroCopyMin,
		CMAMin:      o.CMAMin,
		BigCopy:     o.BigCopy,
		SpinTime:    o.SpinTime,
		ShareCores:  o.Algo != "intra",
		// Nodes that are namespaces or containers of one machine share
		// its cores, which no node's ranks see alone.
		HostOversubscribed: lay.hostRanks > cpus,
	})
	if err != nil {
		return err
	}
	c.node = node
	if o.Algo == "intra" {
		c.eng = groupEngine{node}
	} else if err := c.connectNodes(ctx); err != nil {
		return err
	}
	c.sizes = make([]int, o.WorldSize)
	c.offs = make([]int, o.WorldSize)
	if kind == device.CUDA && o.Backend == device.Auto && len(lay.members[lay.myNode]) > kernels.MaxLocal {
		kind = device.CPU // more ranks on the node than the GPU kernels take
	}
	if kind == device.CUDA {
		if err := c.initGPU(ctx, lay); err != nil {
			return err
		}
	} else {
		c.stream = device.NewCPUStream()
		c.stream.WaitTimeout = o.Timeout
	}
	if o.Debug != "" {
		fmt.Fprintf(os.Stderr, "slimego INFO rank %d/%d local %d/%d node %d/%d backend %s store %s run %s timeout %v algo %s machine %d ranks %d cpus oversubscribed %v\n",
			o.Rank, o.WorldSize, o.LocalRank, o.LocalWorldSize, o.NodeRank, c.nodes, c.describeBackend(), c.storeAddr(), o.RunID, o.Timeout, o.Algo,
			lay.hostRanks, cpus, c.node != nil && c.node.Oversubscribed())
	}
	return nil
}

func merge(opts, env Options) Options {
	o := opts
	if o.WorldSize == 0 {
		o.Rank, o.WorldSize = env.Rank, env.WorldSize
		o.LocalRank, o.LocalWorldSize, o.NodeRank = env.LocalRank, env.LocalWorldSize, env.NodeRank
	}
	if o.LocalWorldSize == 0 {
		o.LocalWorldSize, o.LocalRank, o.NodeRank = o.WorldSize, o.Rank, 0
	}
	pick := func(a, b string) string {
		if a != "" {
			return a
		}
		return b
	}
	o.MasterAddr = pick(o.MasterAddr, env.MasterAddr)
	if o.MasterPort == 0 {
		o.MasterPort = env.MasterPort
		o.AgentStore = o.AgentStore || env.AgentStore
	}
	if opts.MasterPort == 0 {
		// The environment's store: its launcher's job and attempt, whatever
		// the program calls its keys.
		if o.JobID == "" {
			o.JobID = env.JobID
		}
		if o.Attempt == 0 {
			o.Attempt = env.Attempt
		}
	}
	o.RunID = pick(o.RunID, env.RunID)
	o.JobID = pick(o.JobID, o.RunID)
	if o.JobSecret == nil {
		o.JobSecret = env.JobSecret
	}
	o.Name = pick(pick(o.Name, env.Name), "world")
	if o.Timeout == 0 {
		o.Timeout = env.Timeout
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Backend == device.Auto {
		o.Backend = env.Backend
	}
	o.Debug = pick(o.Debug, env.Debug)
	o.Algo = pick(pick(o.Algo, env.Algo), "auto")
	if o.Algo == "intra" {
		// What Options reports on one node (chooseAlgo's choice there):
		// options taken from a communicator open a second one as auto,
		// which on one node is intra again.
		o.Algo = "auto"
	}
	o.SocketIfName = pick(o.SocketIfName, env.SocketIfName)
	if o.Channels == 0 {
		o.Channels = env.Channels
	}
	if o.SpinTime == 0 {
		o.SpinTime = env.SpinTime
	}
	if o.RcvLowat == 0 {
		o.RcvLowat = env.RcvLowat
	}
	o.Eager = o.Eager || env.Eager
	for _, f := range []struct{ dst, src *int }{{&o.SlotBytes, &env.SlotBytes}, {&o.Slots, &env.Slots}, {&o.ZeroCopyMin, &env.ZeroCopyMin}, {&o.CMAMin, &env.CMAMin}, {&o.BigCopy, &env.BigCopy}, {&o.SendCopyMin, &env.SendCopyMin}, {&o.GPUScratch, &env.GPUScratch}, {&o.GPUBlocks, &env.GPUBlocks}} {
		if *f.dst == 0 {
			*f.dst = *f.src
		}
	}
	return o
}

func (o Options) validate() error {
	bad := func(format string, a ...any) error {
		return fault.New("init", o.Rank, -1, ErrInvalid, format, a...)
	}
	switch {
	case o.WorldSize < 1:
		return bad("world size %d", o.WorldSize)
	case o.Rank < 0 || o.Rank >= o.WorldSize:
		return bad("rank %d is not in [0, %d)", o.Rank, o.WorldSize)
	case o.LocalWorldSize < 1 || o.LocalWorldSize > o.WorldSize:
		return bad("local world size %d with world size %d", o.LocalWorldSize, o.WorldSize)
	case o.LocalRank < 0 || o.LocalRank >= o.LocalWorldSize:
		return bad("local rank %d is not in [0, %d)", o.LocalRank, o.LocalWorldSize)
	case o.WorldSize > 1 && o.MasterAddr == "":
		return bad("no master address (MASTER_ADDR)")
	case o.MasterPort < 0 || o.MasterPort > 65535:
		return bad("master port %d", o.MasterPort)
	case o.RunID == "":
		return bad("no run id")
	case o.Timeout < 0:
		return bad("timeout %v is not positive", o.Timeout)
	case o.Attempt < 0:
		return bad("attempt %d", o.Attempt)
	case !ValidAlgo(o.Algo):
		return bad("algorithm %q (want auto, hier or ring)", o.Algo)
	case o.GPUBlocks < 0 || o.GPUBlocks > MaxGPUBlocks:
		return bad("%d GPU thread blocks (want 1 to %d, or 0 for the default)", o.GPUBlocks, MaxGPUBlocks)
	}
	return nil
}

// connect reaches the store: the launcher's, or one that rank 0 hosts. A
// world of one needs none and hosts a private one on a free port.
func (c *Communicator) connect(ctx context.Context) error {
	o := c.opts
	addr := net.JoinHostPort(o.MasterAddr, strconv.Itoa(o.MasterPort))
	host := o.WorldSize == 1 || (!o.AgentStore && o.Rank == 0)
	if host {
		listen, err := storeListenAddr(o)
		if err != nil {
			return fault.New("init", o.Rank, -1, ErrInvalid, "rank 0 hosts the rendezvous store: %v", err)
		}
		s, err := rendezvous.Listen(listen, rendezvous.ServerConfig{Auth: o.auth()})
		if err != nil {
			return fault.New("init", o.Rank, -1, ErrInvalid, "rank 0 hosts the rendezvous store: %v%s", err, portInUse(o, err))
		}
		c.server = s
		addr = s.Addr().String()
	}
	warnIfOpen(o, addr)
	st, err := rendezvous.Dial(ctx, addr, o.auth())
	if err != nil {
		if errors.Is(err, netaddr.ErrUnresolvable) || errors.Is(err, rendezvous.ErrDenied) {
			return fault.New("init", o.Rank, -1, ErrInvalid, "%v", err)
		}
		if errors.Is(err, context.Canceled) {
			return fault.New("init", o.Rank, -1, context.Canceled, "%v", err)
		}
		return fault.New("init", o.Rank, -1, ErrTimeout, "%v", err)
	}
	st.Timeout = o.Timeout
	c.store = st
	return nil
}

// portInUse says, where rank 0 could not host the store because its port
// is taken, how to choose another, and where the port came from when no
// MASTER_PORT named it (srun, mpirun: derived from the run id).
func portInUse(o Options, err error) string {
	if !errors.Is(err, syscall.EADDRINUSE) || o.WorldSize == 1 {
		return ""
	}
	hint := fmt.Sprintf("; port %d is in use (another process, or another job on this host): give the job another MASTER_PORT", o.MasterPort)
	if strings.TrimSpace(os.Getenv("MASTER_PORT")) == "" && o.JobID != "" && o.MasterPort == derivedPort(o.JobID) {
		hint += fmt.Sprintf(" (this one is derived from the run id %s, as none is set)", o.JobID)
	}
	return hint
}

// connectNodes sets up the TCP transport and the algorithm across nodes.
func (c *Communicator) connectNodes(ctx context.Context) error {
	o := c.opts
	t, err := c.dialNodes(ctx, "net")
	if err != nil {
		return err
	}
	c.net = t
	if o.Algo == "ring" {
		c.eng = ringEngine[[]byte]{inter.NewRing(t, o.WorldSize, o.Rank, o.Timeout)}
	} else {
		c.eng = hierEngine[[]byte]{inter.NewHier(c.node, t, c.nodes, o.LocalWorldSize, o.Rank, o.Timeout)}
	}
	return nil
}

// dialNodes connects this rank to the peers across nodes that the chosen
// algorithm talks to (its rail peers for hier, its ring neighbours for the
// ring), under the store key named key.
func (c *Communicator) dialNodes(ctx context.Context, key string) (*inter.Transport, error) {
	o := c.opts
	peers := inter.RailPeers(c.nodes, o.LocalWorldSize, o.Rank)
	if o.Algo == "ring" {
		peers = inter.RingPeers(o.WorldSize, o.Rank)
	}
	return inter.New(ctx, inter.Config{
		Store: c.store, Key: c.key(key), Rank: o.Rank, World: o.WorldSize, Peers: peers, Channels: o.Channels,
		IfName: o.SocketIfName, MasterAddr: o.MasterAddr, Timeout: o.Timeout, Lowat: o.RcvLowat,
		SendCopyMin: o.SendCopyMin, Auth: auth.NewKey(o.JobSecret, o.JobID),
		PollMax: pollMax(c.node != nil && c.node.Oversubscribed()),
	})
}

// pollMax is the transport's polling bound: the default, or none (-1)
// where the node's ranks outnumber the CPUs they run on (intra's
// Oversubscribed, which counts the CPUs of all of them, so that ranks
// bound to a core each are not taken for more than one core holds), since
// there a polling rank may hold the very core that the peer it waits for
// needs (OpenMPI's mpi_yield_when_idle makes the same choice).
func pollMax(oversubscribed bool) time.Duration {
	if oversubscribed {
		return -1
	}
	return 0
}

// plan prepares name(dst, src) with the sizes and offsets in c.sizes and
// c.offs on the communicator's engine.
func (c *Communicator) plan(name string, dst, src []byte) (planned[[]byte], error) {
	return c.eng.Plan(name, dst, src, c.sizes, c.offs)
}

func (c *Communicator) storeAddr() string {
	if c.store == nil {
		return ""
	}
	return c.store.Addr()
}

func (c *Communicator) key(s string) string {
	return c.opts.StoreKey(c.scope + "/" + s)
}

// StoreKey is store key s of this attempt of the job: under the
// attempt's prefix (rendezvous.AttemptPrefix), which slimerun aborts when
// any worker of the attempt exits, with code 0 too, so that a wait for a
// key not yet set fails at once, naming that worker, rather than running
// out its timeout on a rank that will never come (on another node, where
// that node's slimerun cannot stop the waiting ranks itself). A run id of
// the program's own choosing nests below it. A program that keeps keys of
// its own in the job's store beside or without a communicator
// (p2p.Options.Prefix, barriers) names them with it, and then waits on
// them only while every rank is still running, as the collectives do.
// Under other launchers the prefix only keeps attempts apart.
func (o Options) StoreKey(s string) string {
	job := o.JobID
	if job == "" {
		job = o.RunID
	}
	p := rendezvous.AttemptPrefix(job, o.Attempt)
	if o.RunID != job {
		p += "run/" + o.RunID + "/"
	}
	return p + s
}

// attemptID names this attempt of the job in shared-memory names.
func (o Options) attemptID() string {
	if o.Attempt == 0 {
		return o.RunID
	}
	return o.RunID + "-r" + strconv.Itoa(o.Attempt)
}

// auth is what the job's connections prove they hold.
func (o Options) auth() rendezvous.Auth {
	return rendezvous.Auth{Secret: o.JobSecret, Job: o.JobID}
}

// Rank is this rank's index in the job, Size the number of ranks.
func (c *Communicator) Rank() int { return c.opts.Rank }
func (c *Communicator) Size() int { return c.opts.WorldSize }

// LocalRank is the rank's index on its node, LocalSize the ranks per node.
func (c *Communicator) LocalRank() int { return c.opts.LocalRank }
func (c *Communicator) LocalSize() int { return c.opts.LocalWorldSize }

// NodeRank is the node's index, Nodes the number of nodes.
func (c *Communicator) NodeRank() int { return c.opts.NodeRank }
func (c *Communicator) Nodes() int    { return c.nodes }

// Describe says how the communicator moves data across nodes, for reports:
// empty on one node.
func (c *Communicator) Describe() string {
	if c.net == nil {
		return ""
	}
	return fmt.Sprintf(" algo=%s channels=%d", c.opts.Algo, c.Channels())
}

// Channels is the number of TCP connections per peer pair across nodes:
// 0 on one node.
func (c *Communicator) Channels() int {
	if c.net == nil {
		return 0
	}
	if c.opts.Channels <= 0 {
		return inter.DefaultChannels
	}
	return c.opts.Channels
}

// StripeBytes is the smallest message that the transport across nodes
// spreads over every connection of a peer pair: a smaller one moves over
// fewer connections, and slower. 0 on one node.
func (c *Communicator) StripeBytes() int {
	return inter.StripeMin * c.Channels()
}

// Options are the options the communicator runs with, environment merged.
func (c *Communicator) Options() Options { return c.opts }

// Timeout is the bound on every wait.
func (c *Communicator) Timeout() time.Duration { return c.opts.Timeout }

// Close leaves the job: peers still waiting on this rank get ErrPeerLost.
// It unmaps all shared memory (whose names were already unlinked) and,
// on the rank that hosts it, stops the store.
func (c *Communicator) Close() error {
	// A call of another goroutine is waited for (it ends by its own
	// deadline); pulling the memory from under it would crash it.
	// A call lasts at most about two timeouts (its own wait, or a
	// refusal's, then the explanation of a mismatch) and a few seconds;
	// three leave room.
	// A Timeout near the largest Duration ("none") waits as long.
	wait := time.Duration(math.MaxInt64)
	if c.opts.Timeout < (wait-10*time.Second)/3 {
		wait = 3*c.opts.Timeout + 10*time.Second
	}
	start := time.Now()
	for !c.busy.CompareAndSwap(idle, closed) {
		if c.busy.Load() == closed {
			return nil
		}
		if time.Since(start) > wait {
			return fault.New("close", c.opts.Rank, -1, ErrTimeout, "a call of another goroutine did not return within %v; nothing was closed", wait)
		}
		time.Sleep(time.Millisecond)
	}
	c.closeGPU()
	if c.stream != nil {
		c.stream.Close()
		c.stream = nil
	}
	c.eng = nil
	if c.net != nil {
		c.net.Close()
		c.net = nil
	}
	if c.node != nil {
		c.node.Close()
		c.node = nil
	}
	if c.store != nil {
		c.store.Close()
		c.store = nil
	}
	if c.server != nil {
		// This rank hosts the store: let the others finish with it.
		c.server.Shutdown(min(c.opts.Timeout, 10*time.Second))
		c.server = nil
	}
	release(c.id)
	c.id = ""
	return nil
}

// The states of Communicator.busy.
const (
	idle int32 = iota
	inCall
	closed
)

// enter marks the start of a call of op: ErrInvalid where another
// goroutine's call is in progress (the two would pair with the peers'
// calls in any order, or one would free what the other uses), ErrClosed
// once closed. One compare-and-swap: no lock, no allocation.
func (c *Communicator) enter(op string) error {
	if c.busy.CompareAndSwap(idle, inCall) {
		return nil
	}
	if c.busy.Load() == closed {
		return c.closedErr(op)
	}
	return fault.New(op, c.opts.Rank, -1, ErrInvalid, "another goroutine is in a call on this communicator: one goroutine drives it at a time")
}

// leave ends a call that enter started.
func (c *Communicator) leave() { c.busy.CompareAndSwap(inCall, idle) }

func (c *Communicator) closedErr(op string) error {
	return fault.New(op, c.opts.Rank, -1, ErrClosed, "")
}

// Barrier returns once every rank has entered it.
func (c *Communicator) Barrier(ctx context.Context) error {
	if err := c.enter("barrier"); err != nil {
		return err
	}
	defer c.leave()
	if c.eng == nil {
		return c.closedErr("barrier")
	}
	if err := c.eng.Barrier(ctx); err != nil {
		return c.failed(c.explain(ctx, err, call{name: "barrier"}))
	}
	return nil
}

// AllGather gathers every rank's src into dst, rank r's block at
// dst[r*len(src):]: dst must hold Size()*len(src) bytes. Every rank passes
// the same len(src). src may be this rank's own block of dst (in place).
func (c *Communicator) AllGather(ctx context.Context, dst, src []byte) error {
	if err := c.enter("allgather"); err != nil {
		return err
	}
	defer c.leave()
	if c.eng == nil {
		return c.closedErr("allgather")
	}
	n := len(src)
	if len(dst) < c.Size()*n {
		return c.refuse(ctx, "allgather", fault.New("allgather", c.Rank(), -1, ErrInvalid, "destination holds %d bytes, %d ranks × %d bytes need %d", len(dst), c.Size(), n, c.Size()*n))
	}
	for r := range c.sizes {
		c.sizes[r], c.offs[r] = n, r*n
	}
	return c.runOneShot(ctx, "allgather", dst, src)
}

// AllGatherV gathers blocks of different sizes: rank r contributes
// counts[r] bytes, and they land one after another in dst. Every rank
// passes the same counts, and its own src of counts[Rank()] bytes.
func (c *Communicator) AllGatherV(ctx context.Context, dst, src []byte, counts []int) error {
	return c.allGatherV(ctx, dst, src, counts, nil)
}

// allGatherV is AllGatherV, refused (taking part, as refuse does) with
// invalid where that is not nil: counts its caller found bad.
func (c *Communicator) allGatherV(ctx context.Context, dst, src []byte, counts []int, invalid error) error {
	if err := c.enter("allgatherv"); err != nil {
		return err
	}
	defer c.leave()
	if c.eng == nil {
		return c.closedErr("allgatherv")
	}
	if invalid == nil {
		invalid = c.layoutV(counts, len(dst))
	}
	if invalid != nil {
		return c.refuse(ctx, "allgatherv", invalid)
	}
	return c.runOneShot(ctx, "allgatherv", dst, src)
}

func (c *Communicator) layoutV(counts []int, dstLen int) error {
	if len(counts) != c.Size() {
		return fault.New("allgatherv", c.Rank(), -1, ErrInvalid, "%d counts for %d ranks", len(counts), c.Size())
	}
	off := 0
	for r, n := range counts {
		if n < 0 {
			return fault.New("allgatherv", c.Rank(), -1, ErrInvalid, "negative count %d for rank %d", n, r)
		}
		c.sizes[r], c.offs[r] = n, off
		if n > math.MaxInt-off { // a sum that would wrap round and pass
			return fault.New("allgatherv", c.Rank(), -1, ErrInvalid, "the counts add up to more than an int holds (at rank %d's, %d)", r, n)
		}
		off += n
	}
	if off > dstLen {
		return fault.New("allgatherv", c.Rank(), -1, ErrInvalid, "destination holds %d bytes, the counts add up to %d", dstLen, off)
	}
	return nil
}

func (c *Communicator) runOneShot(ctx context.Context, name string, dst, src []byte) error {
	if err := c.srcApart(name, dst, src); err != nil {
		return c.refuse(ctx, name, err)
	}
	// One op per operation: an op names its errors (and hashes its calls)
	// with the name it was planned under.
	slot := &c.oneShot
	if name == "allgatherv" {
		slot = &c.oneShotV
	}
	if *slot == nil {
		op, err := c.plan(name, dst, src)
		if err != nil {
			return c.refuse(ctx, name, err)
		}
		*slot = op
	} else if err := (*slot).Set(dst, src, c.sizes, c.offs); err != nil {
		return c.refuse(ctx, name, err)
	}
	if err := (*slot).Run(ctx); err != nil {
		return c.failed(c.explain(ctx, err, call{name: name, sizes: c.sizes}))
	}
	return nil
}

// refuse takes part in a one-shot call that this rank refuses with lerr
// (a bad argument), so that the ranks stay in step: left out, the others'
// call would pair with this rank's next one, and both would move the
// wrong data without an error. It runs an all-gather of nothing under an
// operation name of its own, which agrees with the other ranks' only
// where they refuse their call too (and then nothing moves, and each
// returns its own error); otherwise every rank's call differs, and the
// explanation (explain) names this rank and its reason on every other
// rank, as ErrInvalid. It returns lerr, or the engine's error where the
// engine failed otherwise (the communicator is then broken).
func (c *Communicator) refuse(ctx context.Context, name string, lerr error) error {
	if !errors.Is(lerr, ErrInvalid) {
		return lerr // the engine is broken or closed: nothing to take part in
	}
	return c.leaveOut(ctx, name, lerr)
}

// leaveOut is refuse for a call that this rank leaves out for lerr,
// whatever its kind: it takes part as refuse does and returns lerr (or
// the engine's error where the engine failed otherwise).
func (c *Communicator) leaveOut(ctx context.Context, name string, lerr error) error {
	for r := range c.sizes {
		c.sizes[r], c.offs[r] = 0, 0
	}
	if c.refusal == nil {
		op, err := c.plan(refusedOp, nil, nil)
		if err != nil {
			return lerr
		}
		c.refusal = op
	} else if err := c.refusal.Set(nil, nil, c.sizes, c.offs); err != nil {
		return lerr
	}
	err := c.refusal.Run(ctx)
	if err != nil && (errors.Is(err, intra.ErrCallsDiffer) || errors.Is(err, inter.ErrCallsDiffer)) {
		c.explain(ctx, err, call{name: name, refused: reasonOf(lerr)})
		return lerr
	}
	if err != nil {
		// The peers never made the call, or failed in it: the engine's
		// error (the communicator is now broken), named after the call
		// this rank made, with the reason it refused it.
		var oe *fault.OpError
		peer := -1
		if errors.As(err, &oe) {
			peer = oe.Peer
		}
		return c.failed(fault.New(name, c.opts.Rank, peer, err, "this rank refused its call (%s), and while it took part the others did not join", reasonOf(lerr)))
	}
	return lerr
}

// refusedOp names the all-gather of nothing that a refused call runs: a
// name no call of the API has, so that its hash differs from theirs.
const refusedOp = "refused"

// reasonOf is what a refused call's error says, for the other ranks: at
// most maxReason bytes, cut at a character's start, as every rank reads
// it from the store.
func reasonOf(err error) string {
	var oe *fault.OpError
	r := err.Error()
	if errors.As(err, &oe) {
		r = oe.Detail
	}
	if r == "" {
		r = "a bad argument"
	}
	return cutReason(r)
}

// Plan is an all-gather prepared once for fixed buffers, whatever the
// backend: [Communicator.PlanBuffers], PlanBuffersV and PlanBuffersBlocks
// plan one of the backend's device.Buffer values, ordered on Stream();
// [Communicator.Plan], PlanV and PlanBlocks one of host byte slices on
// either backend.
// Each Run moves the buffers' current contents and allocates nothing (across
// nodes, a context that can be cancelled costs one watch when it is first
// given, then nothing while later runs are given the same one). Run it from
// one goroutine.
type Plan struct {
	c   *Communicator
	eng planEngine
	// call is what a host plan passes, to name the rank whose call
	// differs on a mismatch (explain); zero for a GPU plan.
	call call
	// freed, where not nil, says whether the plan's memory lies in a
	// symmetric buffer freed since (intra.Group.FreedCheck): a run is then
	// refused, in step with the peers, rather than fault.
	freed func() error
}

// planEngine is what runs a Plan: the host all-gather of the
// communicator's engine (shared memory, TCP), or a device-memory one
// (gpuPlan).
type planEngine interface {
	// launch starts one all-gather; on the host it runs to completion.
	launch(ctx context.Context) error
	// wait waits for what launch started and reports what it saw.
	wait(ctx context.Context) error
	mode() string
	close() error
}

// hostPlan is a planned all-gather of host memory. closed is set by the
// plan's Close, after which a launch is ErrClosed, as a plan of buffers'
// is (streamPlan, gpuPlan); a pointer made at planning, so that a launch
// copies nothing, and atomic, since a Close from another goroutine (a
// misuse: Close is a collective call) must not race with a run.
type hostPlan struct {
	op     planned[[]byte]
	c      *Communicator
	name   string
	closed *atomic.Bool
}

func (h hostPlan) launch(ctx context.Context) error {
	if h.closed.Load() {
		// Closed here, maybe not on the peers (a closed plan's run is a
		// mistake of this rank's): take part as a refused call does, so
		// that the peers' call fails naming this rank and the ranks stay
		// in step.
		return h.c.leaveOut(ctx, h.name, fault.New(h.name, h.c.Rank(), -1, ErrPlanClosed, "Plan.Close was called; the communicator is open: plan the call again"))
	}
	return h.op.Run(ctx)
}
func (hostPlan) wait(context.Context) error { return nil }
func (hostPlan) mode() string               { return "host" }
func (h hostPlan) close() error             { h.closed.Store(true); return nil }

// srcApart refuses, as ErrInvalid, a source that overlaps the
// destination other than as this rank's own block of it (in place, which
// starts at c.offs[Rank()]), whatever the engine: the node's group checks
// this itself, but the ring across nodes would send from memory that the
// gather writes (and copy the own block over its own source), and return
// nil.
func (c *Communicator) srcApart(name string, dst, src []byte) error {
	if len(src) == 0 || len(dst) == 0 {
		return nil
	}
	if off := c.offs[c.Rank()]; off >= 0 && off < len(dst) && &dst[off] == &src[0] {
		return nil // in place (whether the block fits is the engine's check)
	}
	s0, d0 := uintptr(unsafe.Pointer(&src[0])), uintptr(unsafe.Pointer(&dst[0]))
	if s0 < d0+uintptr(len(dst)) && d0 < s0+uintptr(len(src)) {
		return fault.New(name, c.Rank(), -1, ErrInvalid, "source overlaps the destination other than at this rank's own block")
	}
	return nil
}

func (c *Communicator) hostPlan(name string, dst, src []byte) (*Plan, error) {
	if err := c.srcApart(name, dst, src); err != nil {
		return nil, err
	}
	op, err := c.plan(name, dst, src)
	if err != nil {
		return nil, err
	}
	p := &Plan{c: c, eng: hostPlan{op: op, c: c, name: name, closed: new(atomic.Bool)}, call: call{name: name, sizes: slices.Clone(c.sizes)}}
	p.freed = c.node.FreedCheck(name, dst, src)
	return p, nil
}

// refuseFreed refuses a run of a plan whose memory has been freed (see
// Plan.freed), taking part as a refused call does, and returns why; nil
// where the plan may run.
func (p *Plan) refuseFreed(ctx context.Context) error {
	if p.freed == nil {
		return nil
	}
	if err := p.freed(); err != nil {
		return p.c.refuse(ctx, p.opName(), err) // never nil: err, or the engine's
	}
	return nil
}

// Plan prepares AllGather(dst, src) for repeated runs.
func (c *Communicator) Plan(dst, src []byte) (*Plan, error) {
	if err := c.enter("allgather"); err != nil {
		return nil, err
	}
	defer c.leave()
	if c.eng == nil {
		return nil, c.closedErr("plan")
	}
	n := len(src)
	if len(dst) < c.Size()*n {
		return nil, fault.New("allgather", c.Rank(), -1, ErrInvalid, "destination holds %d bytes, %d ranks × %d bytes need %d", len(dst), c.Size(), n, c.Size()*n)
	}
	for r := range c.sizes {
		c.sizes[r], c.offs[r] = n, r*n
	}
	return c.hostPlan("allgather", dst, src)
}

// PlanV prepares AllGatherV(dst, src, counts) for repeated runs.
func (c *Communicator) PlanV(dst, src []byte, counts []int) (*Plan, error) {
	if err := c.enter("allgatherv"); err != nil {
		return nil, err
	}
	defer c.leave()
	if c.eng == nil {
		return nil, c.closedErr("plan")
	}
	if err := c.layoutV(counts, len(dst)); err != nil {
		return nil, err
	}
	return c.hostPlan("allgatherv", dst, src)
}

// Run performs one all-gather and waits for it, within the communicator's
// timeout: a peer that does not arrive, or that announces another size, is
// an *OpError naming it on every rank.
func (p *Plan) Run(ctx context.Context) error {
	if err := p.c.enter(p.opName()); err != nil {
		return err
	}
	defer p.c.leave()
	if err := p.refuseFreed(ctx); err != nil {
		return err
	}
	if err := p.eng.launch(ctx); err != nil {
		return p.c.failed(p.c.explain(ctx, err, p.call))
	}
	if err := p.eng.wait(ctx); err != nil {
		return p.c.failed(err)
	}
	return nil
}

// opName is the operation a plan's errors name: its call's, or allgather
// for a plan of device memory.
func (p *Plan) opName() string {
	if p.call.name != "" {
		return p.call.name
	}
	return "allgather"
}

// Launch starts one all-gather without waiting for it where the backend
// can: a plan of GPU memory enqueues its kernels on Stream(), and a
// later Check (or Run) collects the outcome; work ordered after them on
// that stream sees the gathered data. A plan of host memory runs to
// completion here (one of device.HostBuffer values after the work
// pending on Stream()).
func (p *Plan) Launch(ctx context.Context) error {
	if err := p.c.enter(p.opName()); err != nil {
		return err
	}
	defer p.c.leave()
	if err := p.refuseFreed(ctx); err != nil {
		return err
	}
	if err := p.eng.launch(ctx); err != nil {
		return p.c.failed(p.c.explain(ctx, err, p.call))
	}
	return nil
}

// Check waits for what Launch started and reports what the kernels saw;
// on host memory there is nothing to wait for.
func (p *Plan) Check(ctx context.Context) error {
	if err := p.c.enter(p.opName()); err != nil {
		return err
	}
	defer p.c.leave()
	if err := p.eng.wait(ctx); err != nil {
		return p.c.failed(err)
	}
	return nil
}

// Mode says how the plan runs: "host" for host memory; for GPU memory
// "graph" (its launches captured into a CUDA graph), "eager", "staged"
// (across nodes: the job's algorithm over the node's GPU group and TCP,
// blocks staged through pinned host memory, synchronous) or "host-staged"
// (through host memory and the CPU backend's engine).
func (p *Plan) Mode() string { return p.eng.mode() }

// String says where and how the plan runs.
func (p *Plan) String() string {
	return fmt.Sprintf("allgather on %s, %s mode", p.c.describeBackend(), p.Mode())
}

// Close releases the plan. It is a collective call: every rank closes its
// plans in the same order. A plan of GPU memory returns once every rank
// has closed it (or the timeout passed), so that the buffers freed after
// it are in no rank's kernel any more; one of host memory holds nothing to
// release. A closed plan's later runs are ErrClosed on this rank, and the
// peers' same call fails naming it, as for a refused call.
func (p *Plan) Close() error { return p.eng.close() }

// Buffer is symmetric memory from [Communicator.Alloc]: every rank of the
// node holds one of the same size, and the peers read this rank's in
// place.
type Buffer struct {
	b *intra.Buffer
	c *Communicator
}

// Bytes is this rank's part of the buffer (nil once freed, or once the
// communicator is closed: Close unmaps it).
func (b *Buffer) Bytes() []byte { return b.b.Bytes() }

// File is the shared-memory file that holds the buffer and where this
// rank's part starts in it (fd -1 once freed): p2p.MapShared(fd, off,
// len(Bytes())) makes it Shared memory that peers on this host copy to
// and from through a mapping of their own (zero copy). The descriptor
// stays the buffer's: do not close it.
func (b *Buffer) File() (fd int, off int64) { return b.b.File() }

// Free unmaps the buffer on this rank. Every rank frees it, between
// operations that use it: a Free while another goroutine's call is in
// progress is refused (ErrInvalid), as any call then is, since that call
// may be reading or writing the buffer; a Plan over it refuses its later
// runs.
func (b *Buffer) Free() error {
	if err := b.c.enter("free"); err != nil {
		if errors.Is(err, ErrClosed) {
			return nil // Close unmapped it
		}
		return err
	}
	defer b.c.leave()
	return b.b.Free()
}

// Alloc returns n bytes of symmetric memory: every rank calls it with the
// same n, and an AllGather whose source lies in such a buffer is read by
// the peers in place. Free it with Buffer.Free on every rank. The ranks of
// a node share one segment: where one asks for another n, every rank of
// the node fails with ErrSizeMismatch naming it, and nothing is left
// allocated. A rank whose call at this point is another (an AllGather,
// a Barrier), on this node or another, makes every rank fail with
// ErrSizeMismatch naming both calls at once.
func (c *Communicator) Alloc(ctx context.Context, n int) (*Buffer, error) {
	if err := c.enter("alloc"); err != nil {
		return nil, err
	}
	defer c.leave()
	if c.eng == nil {
		return nil, c.closedErr("alloc")
	}
	if err := c.announce(ctx, "alloc"); err != nil {
		return nil, err
	}
	b, err := c.node.Alloc(ctx, n)
	if err != nil {
		return nil, err
	}
	return &Buffer{b: b, c: c}, nil
}

// announce takes part in the node's shared-memory protocol under op's
// name, moving nothing, before a call that meets its peers elsewhere
// (Alloc, through the store): a peer in another call (an AllGather, a
// Barrier) then differs from it at once, and every rank returns
// ErrSizeMismatch naming both calls, instead of each waiting out its
// timeout where the other never comes. Across nodes too: a node's
// Alloc meets only its own ranks, and the other nodes' ranks would pair
// their call with that rank's next one.
func (c *Communicator) announce(ctx context.Context, op string) error {
	for r := range c.sizes {
		c.sizes[r], c.offs[r] = 0, 0
	}
	p, err := c.plan(op, nil, nil)
	if err != nil {
		return err
	}
	if err := p.Run(ctx); err != nil {
		return c.failed(c.explain(ctx, err, call{name: op}))
	}
	return nil
}

// Elem is the element types the typed forms take.
type Elem interface {
	~int8 | ~uint8 | ~int16 | ~uint16 | ~int32 | ~uint32 | ~int64 | ~uint64 |
		~float32 | ~float64 | ~complex64 | ~complex128
}

func asBytes[T Elem](s []T) []byte {
	if len(s) == 0 {
		return s2b(s)
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(s[0])))
}

func s2b[T Elem](s []T) []byte {
	if s == nil {
		return nil
	}
	return []byte{}
}

// AllGatherOf is [Communicator.AllGather] on typed slices.
func AllGatherOf[T Elem](ctx context.Context, c *Communicator, dst, src []T) error {
	return c.AllGather(ctx, asBytes(dst), asBytes(src))
}

// AllGatherVOf is [Communicator.AllGatherV] with counts in elements.
func AllGatherVOf[T Elem](ctx context.Context, c *Communicator, dst, src []T, counts []int) error {
	var z T
	sz := int(unsafe.Sizeof(z))
	bc := make([]int, len(counts))
	for i, n := range counts {
		if n > math.MaxInt/sz || n < math.MinInt/sz {
			// Its bytes would wrap (to 0, say): refused as any bad
			// argument is, taking part so that the ranks stay in step.
			return c.allGatherV(ctx, nil, nil, nil, fault.New("allgatherv", c.Rank(), -1, ErrInvalid, "count %d for rank %d: %d-byte elements overflow", n, i, sz))
		}
		bc[i] = n * sz
	}
	return c.AllGatherV(ctx, asBytes(dst), asBytes(src), bc)
}

// PlanOf is [Communicator.Plan] on typed slices.
func PlanOf[T Elem](c *Communicator, dst, src []T) (*Plan, error) {
	return c.Plan(asBytes(dst), asBytes(src))
}
