package intra

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/internal/shm"
	"github.com/slimego/slimego/rendezvous"
)

// Defaults: 4 slots of 256 KiB keep a rank's ring in its L2 cache; each
// switch point (zero copy, cross-memory attach, whole copies) is the size
// from which that path beat the one below it (docs/PERFORMANCE.md).
const (
	DefaultSlotBytes   = 256 << 10
	DefaultSlots       = 4
	DefaultZeroCopyMin = 1 << 10
	// OversubscribedZeroCopyMin replaces DefaultZeroCopyMin where ranks
	// outnumber cores. A block read in place holds its owner until every
	// reader has read it, one more hand-over of the processor per call,
	// which costs there more than staging a small block does
	// (docs/PERFORMANCE.md). From it, with the default
	// CMAMin, the alternative to reading in place is cross-memory attach,
	// which needs the same acknowledgement.
	OversubscribedZeroCopyMin = DefaultCMAMin
	DefaultCMAMin             = 16 << 10
	DefaultBigCopy            = 8 << 20
	DefaultTimeout            = 5 * time.Minute
)

// Config describes one rank's membership in a node-local group.
type Config struct {
	// Store and Key: the rendezvous store and a key prefix unique to this
	// group, through which the ranks exchange segment names.
	Store *rendezvous.Client
	Key   string
	// ShmPrefix starts the name of every segment the group creates, so that
	// a launcher can sweep what a killed job left (see shm.RemovePrefix).
	ShmPrefix string
	// Rank and Size are the local rank and the number of ranks on the node.
	Rank, Size int
	// Ranks maps local ranks to the global ranks that errors name; nil
	// means the identity.
	Ranks []int
	// Timeout bounds every wait of every operation.
	Timeout time.Duration
	// SlotBytes and Slots shape each rank's ring of staging slots.
	SlotBytes, Slots int
	// ZeroCopyMin is the smallest block read in place from a symmetric
	// source buffer; smaller ones are staged, which needs no acknowledgement.
	// 0: DefaultZeroCopyMin, or OversubscribedZeroCopyMin where ranks
	// outnumber cores (see Oversubscribed).
	ZeroCopyMin int
	// CMAMin is the smallest block that readers copy straight from the
	// owner's memory with process_vm_readv, where the kernel allows it;
	// negative turns this off.
	CMAMin int
	// BigCopy is the size from which a block is copied in one piece, with
	// the runtime's non-temporal stores; smaller ones stay in the cache.
	BigCopy int
	// ShareCores says network transfers run beside this group's copies:
	// large copies then yield the processor every MiB (see copyBlock).
	ShareCores bool
	// HostOversubscribed says the job's ranks on this machine, this
	// group's and other nodes' (network namespaces or containers of one
	// machine), outnumber its CPUs: the group then waits as where its own
	// ranks outnumber their CPUs (see Oversubscribed), which it cannot see
	// itself.
	HostOversubscribed bool
	// SpinTime is how long a wait spins before it sleeps on its futex;
	// zero picks a default from the number of ranks per CPU.
	SpinTime time.Duration
}

// Group is one rank's handle on the node-local group. Its operations are
// collective: every rank of the group calls them in the same order. A Group
// is not safe for concurrent use.
type Group struct {
	cfg    Config
	rank   int
	size   int
	lay    layout
	job    uint64 // jobHash(cfg.ShmPrefix), in every segment's identity
	seg    *shm.Segment
	mem    []byte
	ctrls  []*ctrl
	hdrs   [][2]*header
	myAcks []*ackLine // my lines about each owner
	toMe   []*ackLine // each reader's line about me
	stamps [][]*uint64
	slots  [][][]byte

	spin    time.Duration
	zcMin   int // the smallest block read in place (Config.ZeroCopyMin, or its default here)
	oversb  bool
	goYield bool // waits yield to this process's goroutines too (see watchPeers)
	cma     bool // every rank reads peers' memory with process_vm_readv
	iov     [1]iovec
	riov    [1]remoteIovec

	pidfds  []int    // per peer; -1 when the peer shares this process
	pids    []int    // per rank, as read once at Init (ctrl.pid is the peer's to rewrite)
	pollfds []pollFD // per peer, for pidfds >= 0

	epoch    uint64
	sent     uint64   // chunks published into my ring, ever
	recv     []uint64 // chunks consumed from each owner's ring, ever
	freeUpTo uint64   // cached minimum of the readers' consumed counters

	// suspected[p] is the waiter round in which peer p was first seen lost,
	// suspectNap[p] the sleep; a loss seen again after a later sleep of the
	// same round (no progress, and polls between) is an error.
	suspected  []uint64
	suspectNap []uint64
	rounds     uint64

	bufs    []*Buffer
	allocs  uint64 // Alloc calls so far: each one's store keys are its own
	barrier *Op
	broken  error
	closed  bool
}

// New joins the group: local rank 0 creates the segment and publishes its
// name through the store, the others map it, and the last to map it unlinks
// the name, so that nothing stays in /dev/shm even if a rank is killed later.
func New(ctx context.Context, cfg Config) (g *Group, err error) {
	if cfg.Size < 1 || cfg.Rank < 0 || cfg.Rank >= cfg.Size {
		return nil, fmt.Errorf("intra: local rank %d of %d: %w", cfg.Rank, cfg.Size, fault.ErrInvalid)
	}
	if cfg.Ranks == nil {
		cfg.Ranks = make([]int, cfg.Size)
		for i := range cfg.Ranks {
			cfg.Ranks[i] = i
		}
	}
	if len(cfg.Ranks) != cfg.Size {
		return nil, fmt.Errorf("intra: %d global ranks for %d local ranks: %w", len(cfg.Ranks), cfg.Size, fault.ErrInvalid)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Slots <= 0 {
		cfg.Slots = DefaultSlots
	}
	zcDefault := cfg.ZeroCopyMin <= 0
	if zcDefault {
		cfg.ZeroCopyMin = DefaultZeroCopyMin
	}
	if cfg.BigCopy <= 0 {
		cfg.BigCopy = DefaultBigCopy
	}
	if cfg.CMAMin == 0 {
		cfg.CMAMin = DefaultCMAMin
	}
	cfg.SlotBytes = SlotBytes(cfg.SlotBytes)
	lay, err := newLayout(cfg.Size, cfg.Slots, cfg.SlotBytes)
	if err != nil {
		return nil, fault.New("init", cfg.Ranks[cfg.Rank], -1, fault.ErrInvalid, "%v", err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Timeout)
		defer cancel()
	}
	g = &Group{cfg: cfg, rank: cfg.Rank, size: cfg.Size, lay: lay}
	defer func() {
		if err != nil {
			if g.rank == 0 && g.seg != nil {
				// The segment's name goes with the failed Init: where a
				// rank never came, nobody counted last to unlink it, and
				// no sweep removes it while this process lives. A rank
				// still on its way fails to open it, as its Init would.
				shm.Unlink(g.seg.Name)
			}
			g.release()
			if _, ok := err.(*fault.OpError); !ok {
				err = fault.New("init", g.global(g.rank), -1, err, "")
			}
		}
	}()
	g.job = jobHash(cfg.ShmPrefix)
	if g.rank == 0 {
		// Remove what killed jobs left before adding to /dev/shm: one
		// ReadDir, and a look at /proc for each tagged name.
		shm.SweepOrphans()
	}
	seg, err := g.shareSegment(ctx, "init", "seg", lay.total, lay.identity(g.job))
	if err != nil {
		return g, err
	}
	g.seg, g.mem = seg, seg.Mem
	g.bind()
	me := g.ctrls[g.rank]
	atomic.StoreUint32(&me.pid, uint32(os.Getpid()))
	atomic.StoreUint64(&me.self, uint64(uintptr(unsafe.Pointer(&me.pid))))
	atomic.StoreUint32(&me.state, stateAlive)
	if err := g.storeBarrier(ctx, "alive"); err != nil {
		return g, err
	}
	if err := g.watchPeers(); err != nil {
		return g, err
	}
	// Cross-memory attach is used only if every rank can read every peer.
	if cfg.CMAMin > 0 && g.probeCMA() {
		atomic.StoreUint32(&me.cmaOK, 1)
	}
	if err := g.storeBarrier(ctx, "probed"); err != nil {
		return g, err
	}
	g.cma = cfg.CMAMin > 0
	for _, c := range g.ctrls {
		g.cma = g.cma && atomic.LoadUint32(&c.cmaOK) == 1
	}
	// 50 µs of polling covers a peer that runs on its own core. When ranks
	// outnumber cores the peer being waited for may need this very core, so
	// a short spin followed by a futex sleep pays a sleep and a wake-up on
	// almost every wait; polling that yields the CPU for up to 1 ms lets
	// the peer run and catches its answer without them, which made small
	// all-gathers among more ranks than cores much faster
	// (docs/PERFORMANCE.md).
	g.spin = cfg.SpinTime
	if g.spin <= 0 {
		g.spin = 50 * time.Microsecond
		if g.oversb {
			g.spin = time.Millisecond
		}
	}
	g.zcMin = cfg.ZeroCopyMin
	if zcDefault && g.oversb {
		g.zcMin = OversubscribedZeroCopyMin
	}
	return g, nil
}

// bind resolves the pointers into the segment once.
func (g *Group) bind() {
	L, K := g.size, g.lay.K
	g.ctrls = make([]*ctrl, L)
	g.hdrs = make([][2]*header, L)
	g.myAcks = make([]*ackLine, L)
	g.toMe = make([]*ackLine, L)
	g.stamps = make([][]*uint64, L)
	g.slots = make([][][]byte, L)
	g.recv = make([]uint64, L)
	g.suspected = make([]uint64, L)
	g.suspectNap = make([]uint64, L)
	for r := range L {
		g.ctrls[r] = g.lay.ctrl(g.mem, r)
		g.hdrs[r] = [2]*header{g.lay.header(g.mem, r, 0), g.lay.header(g.mem, r, 1)}
		g.myAcks[r] = g.lay.ack(g.mem, g.rank, r)
		g.toMe[r] = g.lay.ack(g.mem, r, g.rank)
		g.stamps[r] = make([]*uint64, K)
		g.slots[r] = make([][]byte, K)
		for k := range K {
			g.stamps[r][k], g.slots[r][k] = g.lay.slot(g.mem, r, k)
		}
	}
}

// shareSegment creates (local rank 0) or opens (the others) a segment of
// size bytes whose name travels through the store under key, and unlinks
// its name once all have mapped it. Its errors are *fault.OpError of op.
//
// A name read from the store is not trusted: it must be one of this
// group's (ShmPrefix + key + "-", shm.CheckName), and the file must be a
// regular file of ours, of exactly size bytes, whose first page holds id
// (written by rank 0 before it publishes the name); otherwise the rank
// fails with ErrInvalid, naming rank 0, and neither maps nor unlinks the
// file.
//
// Every rank that read what rank 0 published (a name, or rank 0's error),
// or gave up waiting for it at its deadline, counts itself under
// key/mapped, whether it could map the segment or not.
// The rank whose count reaches the group's size knows that no rank reads
// the two keys again: it deletes them, so that the store, whose keys are
// limited, does not fill up over a long job's allocations; and, if it
// mapped the segment, it unlinks the file's name (the segment then lives
// as long as some rank maps it). A segment that the last rank could not
// map (an Alloc of another size there) is left to the sweeps, which remove
// it once nobody holds it (see shm).
//
// Rank 0 tells the others of its failures at once: it publishes its error
// in place of the name, and where the store refuses even that (it is
// full), it aborts the waits on key, so that no rank waits out its
// timeout. A ctx without a deadline gets the group's Timeout.
func (g *Group) shareSegment(ctx context.Context, op, key string, size int, id identity) (*shm.Segment, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, g.cfg.Timeout)
		defer cancel()
	}
	st, base := g.cfg.Store, g.cfg.Key+"/"+key
	prefix := g.cfg.ShmPrefix + key + "-"
	me, root := g.global(g.rank), g.global(0)
	var seg *shm.Segment
	var failed error // this rank's error, once it has read the name
	// orphan is the segment's name where this rank could not map it for
	// its size: if this rank counts last, it unlinks it all the same.
	var orphan string
	if g.rank == 0 {
		name, err := shm.NewName(prefix)
		if err == nil {
			seg, err = shm.Create(name, size)
		}
		if err != nil {
			// Tell the others at once rather than letting them time out.
			if e := st.Set(ctx, base, []byte("error: "+err.Error())); e != nil {
				st.Abort(ctx, base, root, "local rank 0 could not create shared memory: "+err.Error())
				return nil, fault.New(op, me, -1, err, "")
			}
			if errors.Is(err, shm.ErrNoSpace) || errors.Is(err, shm.ErrBadName) {
				err = fmt.Errorf("%w: %w", fault.ErrInvalid, err)
			}
			failed = fault.New(op, me, -1, err, "")
		} else {
			id.write(seg.Mem)
			if err := st.Set(ctx, base, []byte(name)); err != nil {
				shm.Unlink(name)
				seg.Close()
				st.Abort(ctx, base, root, "local rank 0 could not publish its segment's name: "+err.Error())
				return nil, fault.New(op, me, -1, err, "publishing the segment name")
			}
		}
	} else {
		v, err := st.Get(ctx, base)
		name := string(v)
		if err != nil {
			var ae *rendezvous.AbortError
			if errors.As(err, &ae) {
				return nil, fault.New(op, me, ae.Rank, fault.ErrPeerLost, "waiting for the segment name from local rank 0: %s", ae.Reason)
			}
			// This rank gives up (its deadline) while rank 0 may yet
			// publish and map the segment: it counts itself all the
			// same, so that rank 0, counting last, unlinks the name.
			failed = fault.New(op, me, root, waitErr(err, "the segment name from local rank 0"), "")
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
		} else if msg, ok := strings.CutPrefix(name, "error: "); ok {
			failed = fault.New(op, me, root, fault.ErrPeerLost, "local rank 0 could not create shared memory: %s", msg)
		} else if err := shm.CheckName(name, prefix); err != nil {
			failed = fault.New(op, me, root, fmt.Errorf("%w: %w", fault.ErrInvalid, err), "segment name published for local rank 0")
		} else if seg, err = shm.Open(name, size, id.check); err != nil {
			switch {
			case errors.Is(err, shm.ErrWrongSize) && id.kind == kindBuffer:
				err = fmt.Errorf("%w: %w", fault.ErrSizeMismatch, err)
				orphan = name
			case errors.Is(err, shm.ErrBadName) || errors.Is(err, shm.ErrForeign) || errors.Is(err, shm.ErrWrongSize):
				err = fmt.Errorf("%w: %w", fault.ErrInvalid, err)
			}
			failed = fault.New(op, me, root, err, "segment published for local rank 0")
		}
	}
	n, err := st.Add(ctx, base+"/mapped", 1)
	if err != nil {
		if g.rank == 0 && seg != nil {
			shm.Unlink(seg.Name) // nobody may count last: see New's
		}
		seg.Close()
		if failed != nil {
			return nil, failed
		}
		return nil, fault.New(op, me, -1, err, "counting the ranks that mapped the segment")
	}
	if int(n) == g.size {
		if seg != nil {
			shm.Unlink(seg.Name)
		} else if orphan != "" {
			shm.Unlink(orphan)
		}
		// Every rank has read base and counted itself: nobody reads
		// either key again.
		st.Delete(ctx, base)
		st.Delete(ctx, base+"/mapped")
	}
	if failed != nil {
		seg.Close()
		return nil, failed
	}
	return seg, nil
}

// storeBarrier returns once every local rank has reached the same name.
func (g *Group) storeBarrier(ctx context.Context, name string) error {
	err := g.cfg.Store.Barrier(ctx, g.cfg.Key+"/"+name, g.rank, g.size)
	var me *rendezvous.MissingError
	if errors.As(err, &me) {
		missing := make([]int, len(me.Missing))
		for i, l := range me.Missing {
			missing[i] = g.global(l)
		}
		return waitErr(me.Err, fmt.Sprintf("ranks %v to join", missing))
	}
	return err
}

// sameSize publishes the size this rank asked of a collective allocation
// (as asked: a refused one too) under base and compares everyone's, before
// anything is allocated: where they differ, every rank fails
// with ErrSizeMismatch naming the first rank whose size differs from the
// most common one (local rank 0's on a tie) and both sizes, in the same
// words, rather than leaving the ranks that asked for the segment's size
// with a buffer and the others with an error.
func (g *Group) sameSize(ctx context.Context, op, base string, asked int) error {
	st, me := g.cfg.Store, g.global(g.rank)
	// Bookkeeping gets the call's time, and a second of its own at
	// least: after a failure ctx may be what expired. Not a second alone
	// where the call has more: a store call unanswered past its deadline
	// and the client's answer slack gives up the rank's store connection,
	// so a store slow to answer (a loaded host) would fail this rank's
	// next wait, though the call had time to spare.
	after := func() (context.Context, context.CancelFunc) {
		d := time.Now().Add(time.Second)
		if cd, ok := ctx.Deadline(); ok && cd.After(d) && ctx.Err() == nil {
			d = cd
		}
		return context.WithDeadline(context.WithoutCancel(ctx), d)
	}
	defer func() {
		// Every rank counts itself once it is done with the sizes, failed
		// or not; the last deletes them: nobody reads them again. (A rank
		// that never comes leaves them, with the job's store.)
		actx, cancel := after()
		defer cancel()
		if n, err := st.Add(actx, base+"/n/read", 1); err == nil && int(n) == g.size {
			for p := range g.size {
				st.Delete(actx, base+"/n/"+strconv.Itoa(p))
			}
			st.Delete(actx, base+"/n/read")
		}
	}()
	if err := st.Set(ctx, base+"/n/"+strconv.Itoa(g.rank), []byte(strconv.Itoa(asked))); err != nil {
		// Tell the others at once rather than letting them time out.
		actx, cancel := after()
		defer cancel()
		st.Abort(actx, base, me, fmt.Sprintf("rank %d could not publish its size: %v", me, err))
		return fault.New(op, me, -1, err, "publishing the size asked for")
	}
	sizes := make([]int, g.size)
	for p := range g.size {
		v, err := st.Get(ctx, base+"/n/"+strconv.Itoa(p))
		if err != nil {
			var ae *rendezvous.AbortError
			if errors.As(err, &ae) {
				return fault.New(op, me, ae.Rank, fault.ErrPeerLost, "waiting for local rank %d's size: %s", p, ae.Reason)
			}
			return fault.New(op, me, g.global(p), waitErr(err, fmt.Sprintf("the size local rank %d asked for", p)), "")
		}
		n, err := strconv.Atoi(string(v))
		if err != nil {
			return fault.New(op, me, g.global(p), fault.ErrInvalid, "local rank %d published the size %q", p, v)
		}
		sizes[p] = n
	}
	ref := 0 // the most common size's first rank
	for p := range g.size {
		if c := count(sizes, sizes[p]); c > count(sizes, sizes[ref]) {
			ref = p
		}
	}
	for p := range g.size {
		if c := count(sizes, sizes[p]); p != ref && c == count(sizes, sizes[ref]) && sizes[p] != sizes[ref] {
			ref = 0 // a tie: local rank 0's is the reference
			break
		}
	}
	for p := range g.size {
		if sizes[p] == sizes[ref] {
			continue
		}
		var same []string
		for q := range g.size {
			if sizes[q] == sizes[ref] {
				same = append(same, strconv.Itoa(g.global(q)))
			}
		}
		peer := g.global(p)
		if p == g.rank {
			peer = g.global(ref)
		}
		return fault.New(op, me, peer, fault.ErrSizeMismatch, "the ranks of the node asked for different sizes: rank %d asked for %d bytes, rank(s) %s for %d",
			g.global(p), sizes[p], strings.Join(same, ", "), sizes[ref])
	}
	return nil
}

func count(s []int, v int) int {
	n := 0
	for _, x := range s {
		if x == v {
			n++
		}
	}
	return n
}

func waitErr(err error, what string) error {
	if errors.Is(err, rendezvous.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: waiting for %s: %v", fault.ErrTimeout, what, err)
	}
	return fmt.Errorf("waiting for %s: %w", what, err)
}

// watchPeers opens a pidfd for every peer in another process and decides
// whether ranks outnumber CPUs.
func (g *Group) watchPeers() error {
	g.pidfds = make([]int, g.size)
	g.pollfds = make([]pollFD, g.size)
	mine := uint32(os.Getpid())
	inProc := 0
	pids := make([]int, g.size)
	for p := range g.size {
		g.pidfds[p] = -1
		pid := atomic.LoadUint32(&g.ctrls[p].pid)
		pids[p] = int(pid)
		if pid == mine {
			inProc++
			continue
		}
		fd, err := pidfdOpen(int(pid))
		if err != nil {
			return fmt.Errorf("%w: rank %d (pid %d) is gone: %v", fault.ErrPeerLost, g.global(p), pid, err)
		}
		g.pidfds[p] = fd
		g.pollfds[p] = pollFD{Fd: int32(fd), Events: pollIn}
	}
	g.pids = pids
	cpus := cpusOf(pids) // the ranks' CPUs together, not this process's alone
	if cpus == 0 {
		cpus = runtime.NumCPU()
	}
	g.oversb = g.cfg.HostOversubscribed || g.size > cpus || inProc > runtime.GOMAXPROCS(0)
	// A waiting rank hands its processor over with sched_yield. It
	// yields to this process's goroutines too (runtime.Gosched) only where
	// they may need the very processor: where ranks share the process, or
	// the runtime has one processor. Elsewhere a Gosched only wakes an
	// idle thread of the runtime to look for work that is not there, a
	// wake-up and a sleep on a core the peers need on every try.
	g.goYield = inProc > 1 || runtime.GOMAXPROCS(0) < 2
	return nil
}

func (g *Group) global(local int) int { return g.cfg.Ranks[local] }

// Oversubscribed says whether the group's ranks outnumber the CPUs they
// may run on together (or, where ranks share a process, its processors),
// or Config.HostOversubscribed says the machine's are: their waits then
// hand the processor over at every poll.
func (g *Group) Oversubscribed() bool { return g.oversb }

// Rank and Size are the local rank and the number of local ranks.
func (g *Group) Rank() int { return g.rank }
func (g *Group) Size() int { return g.size }

// Close leaves the group: peers still waiting on this rank see ErrPeerLost.
// It unmaps every segment; their names were unlinked at setup.
func (g *Group) Close() error {
	if g.closed {
		return nil
	}
	if g.ctrls != nil {
		atomic.StoreUint32(&g.ctrls[g.rank].state, stateClosed)
		g.ringAll()
	}
	g.release()
	return nil
}

func (g *Group) release() {
	g.closed = true
	if g.broken == nil {
		g.broken = fault.New("communicator", g.global(g.rank), -1, fault.ErrClosed, "")
	}
	for _, b := range g.bufs {
		if b != nil {
			// Unmapped below: Bytes is nil from now on, as after Free.
			b.bytes = nil
			b.seg.Close()
		}
	}
	g.bufs = nil
	for _, fd := range g.pidfds {
		if fd >= 0 {
			closeFD(fd)
		}
	}
	g.pidfds = nil
	g.seg.Close()
	g.seg, g.mem, g.ctrls = nil, nil, nil
}
