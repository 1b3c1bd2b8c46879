package intra

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/slimego/slimego/internal/callhash"
	"github.com/slimego/slimego/internal/fault"
)

// Op is a planned all-gather over the group: every rank contributes one
// block, and every rank receives all blocks at given offsets of its
// destination. Plan it once with [Group.Plan], then [Op.Run] it as often as
// needed; a run allocates nothing.
type Op struct {
	g       *Group
	name    string
	dst     []byte
	src     []byte
	sizes   []int // bytes contributed by each local rank
	offs    []int // where each rank's block lands in dst
	hash    uint64
	inPlace bool
	// ownElsewhere: the caller puts the own block in place (LeaveOwn)
	ownElsewhere bool
	mode         uint32 // how readers get my block
	zcBuf        uint32 // my source's symmetric buffer id + 1 (modeSymmetric)
	zcOff        uint64 // offset in it, or my source's address (modeCMA)
	chunk        []int  // chunk length of each owner's ring transfer
	count        []int  // chunk count of each owner's ring transfer
	next         []int  // per-run: chunks read from each owner
	staged       []bool
}

// ErrCallsDiffer is the ErrSizeMismatch (errors.Is) of a call whose
// headers disagree: every rank of the group sees every header, so every
// rank returns it from the same call, and no data has moved. (A
// symmetric buffer that one rank has not allocated, or has freed, is a
// plain ErrSizeMismatch of that rank alone, which breaks its group: its
// peers get ErrPeerLost at once.) Package collective then asks the ranks
// what each called, to name the one that differs.
var ErrCallsDiffer error = callsDiffer{}

type callsDiffer struct{}

func (callsDiffer) Error() string { return fault.ErrSizeMismatch.Error() }
func (callsDiffer) Unwrap() error { return fault.ErrSizeMismatch }

// Plan validates a call and prepares it. name names the operation in
// errors ("allgather"). sizes[r] bytes of rank r's block land at offs[r] of
// dst; src is this rank's block and may alias its own place in dst (in
// place). Every rank must pass the same sizes; a rank that does not gets
// ErrSizeMismatch from Run, and so does every other.
func (g *Group) Plan(name string, dst, src []byte, sizes, offs []int) (*Op, error) {
	L := g.size
	o := &Op{g: g, name: name,
		sizes: make([]int, L), offs: make([]int, L), chunk: make([]int, L),
		count: make([]int, L), next: make([]int, L), staged: make([]bool, L)}
	return o, o.Set(dst, src, sizes, offs)
}

// Set re-plans o for other buffers of the same group without allocating.
func (o *Op) Set(dst, src []byte, sizes, offs []int) error {
	g := o.g
	bad := func(format string, a ...any) error {
		return fault.New(o.name, g.global(g.rank), -1, fault.ErrInvalid, format, a...)
	}
	if g.broken != nil {
		return g.broken
	}
	if len(sizes) != g.size || len(offs) != g.size {
		return bad("%d sizes and %d offsets for %d ranks", len(sizes), len(offs), g.size)
	}
	if len(src) != sizes[g.rank] {
		return bad("source holds %d bytes, this rank's block is %d", len(src), sizes[g.rank])
	}
	for p := range g.size {
		if sizes[p] < 0 || offs[p] < 0 || offs[p] > len(dst) || sizes[p] > len(dst)-offs[p] {
			return bad("block of rank %d (%d bytes at offset %d) does not fit the %d-byte destination", g.global(p), sizes[p], offs[p], len(dst))
		}
	}
	copy(o.sizes, sizes)
	copy(o.offs, offs)
	o.dst, o.src, o.hash = dst, src, callhash.Sum(o.name, sizes)
	o.inPlace = false
	if n := len(src); n > 0 {
		own := dst[offs[g.rank] : offs[g.rank]+n]
		switch {
		case &own[0] == &src[0]:
			o.inPlace = true
		case overlaps(src, dst):
			return bad("source overlaps the destination other than at this rank's own block")
		}
	}
	o.mode, o.zcBuf, o.zcOff = modeStaged, 0, 0
	if len(src) >= g.zcMin {
		if id, off, ok := g.lookup(src); ok {
			o.mode, o.zcBuf, o.zcOff = modeSymmetric, uint32(id+1), uint64(off)
		}
	}
	if o.mode == modeStaged && g.cma && len(src) >= g.cfg.CMAMin {
		o.mode, o.zcOff = modeCMA, uint64(uintptr(unsafe.Pointer(&src[0])))
	}
	for p := range g.size {
		o.chunk[p], o.count[p] = chunking(sizes[p], g.lay.C)
	}
	return nil
}

// LeaveOwn(true) makes Run leave this rank's own block of dst to the
// caller, who puts it in place some other way; an all-gather across nodes
// does so with a copy that rides with the block's send over the network.
// The other ranks still read the block from src. It holds until changed.
func (o *Op) LeaveOwn(leave bool) { o.ownElsewhere = leave }

func overlaps(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	a0, b0 := uintptr(unsafe.Pointer(&a[0])), uintptr(unsafe.Pointer(&b[0]))
	return a0 < b0+uintptr(len(b)) && b0 < a0+uintptr(len(a))
}

// Run executes the planned operation once. On ErrCallsDiffer the group
// stays usable; on any other error it is broken and every later call
// returns ErrClosed.
func (o *Op) Run(ctx context.Context) error {
	g := o.g
	if g.broken != nil {
		return g.broken
	}
	if err := ctx.Err(); err != nil {
		// A context done before the call began ends it here, before this
		// rank announces anything: the waits look at the context only
		// when they find nothing to read, so a rank that came after its
		// peers had published moved the data and returned nil, while a
		// peer that waited for it failed. The peers waiting for this rank
		// now see it failed, and name it.
		what := "context cancelled before the call began"
		if errors.Is(err, context.DeadlineExceeded) {
			err, what = fault.ErrTimeout, "context's deadline passed before the call began"
		}
		err = fault.New(o.name, g.global(g.rank), -1, err, "%s", what)
		g.fail(err)
		return err
	}
	if err := o.run(ctx); err != nil {
		// Whom this rank blames goes first: a reader that finds the
		// block withdrawn names that rank.
		g.noteBlame(err)
		if o.mode != modeStaged {
			// This call's header offers the block in place: no reader
			// may take it once this rank has returned (withdraw).
			o.withdraw(g.epoch)
		}
		if oe, ok := err.(*fault.OpError); ok && errors.Is(oe.Err, fault.ErrSizeMismatch) {
			return err
		}
		if o.mode == modeStaged {
			// The block went inline or through the ring: withdrawn all
			// the same, so that a reader that comes after this rank gave
			// up (a cancel while it waited for a later rank) fails the
			// call too (run's last step) instead of returning nil.
			o.withdraw(g.epoch)
		}
		g.fail(err)
		return err
	}
	return nil
}

func (o *Op) run(ctx context.Context) error {
	g := o.g
	L, me := g.size, g.rank
	e := g.epoch + 1
	g.epoch = e
	par := int(e & 1)
	w := g.newWaiter(ctx, o.name)

	// 1. Announce: header e, with the data inline when it is small.
	mySize := o.sizes[me]
	h := g.hdrs[me][par]
	h.size, h.hash, h.mode, h.zcBuf, h.zcOff = uint64(mySize), o.hash, o.mode, o.zcBuf, o.zcOff
	if o.mode == modeStaged && mySize <= InlineBytes {
		copy(h.inline[:], o.src)
	}
	atomic.StoreUint64(&h.epoch, e)
	g.ringAll()
	ownCopied := o.inPlace || o.ownElsewhere

	// 2. Every peer's header, checked before any data moves.
	mismatch := -1
	for p := range L {
		if p == me {
			continue
		}
		ph := g.hdrs[p][par]
		for atomic.LoadUint64(&ph.epoch) != e {
			if err := w.idle(p, "the header"); err != nil {
				return err
			}
		}
		w.progress()
		if mismatch < 0 && (ph.size != uint64(o.sizes[p]) || ph.hash != o.hash) {
			mismatch = p
		}
	}
	if mismatch >= 0 {
		ph := g.hdrs[mismatch][par]
		return fault.New(o.name, g.global(me), g.global(mismatch), ErrCallsDiffer,
			"this rank expects %d bytes from rank %d, which contributes %d; the ranks' calls differ", o.sizes[mismatch], g.global(mismatch), ph.size)
	}

	// 3. Data: inline and zero-copy blocks at once, ring transfers pipelined.
	pending := 0
	for p := range L {
		o.next[p], o.staged[p] = 0, false
		if p == me || o.sizes[p] == 0 {
			continue
		}
		ph := g.hdrs[p][par]
		dst := o.dst[o.offs[p] : o.offs[p]+o.sizes[p]]
		switch {
		case ph.mode == modeSymmetric:
			src, err := g.peerBytes(p, int(ph.zcBuf-1), int(ph.zcOff), len(dst))
			if err != nil {
				// The owner waits for this rank's acknowledgement, and
				// the readers of this rank's own block for its chunks:
				// the group cannot go on, and its peers learn so now
				// rather than at their timeout.
				err = fault.New(o.name, g.global(me), g.global(p), fault.ErrSizeMismatch, "%v", err)
				g.fail(err)
				return err
			}
			if !g.claim(p, e) {
				return o.withdrawn(p)
			}
			copyBlock(dst, src, g.cfg.BigCopy, g.cfg.ShareCores)
			if !g.copied(p, e) {
				return o.withdrawn(p)
			}
			g.ring(p)
		case ph.mode == modeCMA:
			if !g.claim(p, e) {
				return o.withdrawn(p)
			}
			if err := g.cmaRead(p, dst, ph.zcOff); err != nil {
				// The owner may have given up on another rank and exited.
				why, culprit := g.follow(p, "reading its memory: "+err.Error())
				return fault.New(o.name, g.global(me), culprit, fault.ErrPeerLost, "%s", why)
			}
			if !g.copied(p, e) {
				return o.withdrawn(p)
			}
			g.ring(p)
		case len(dst) <= InlineBytes:
			copy(dst, ph.inline[:len(dst)])
		default:
			o.staged[p] = true
			pending++
		}
	}
	toSend := 0
	if o.mode == modeStaged {
		toSend = o.count[me]
	}
	sent := 0
	K := uint64(g.lay.K)
	for sent < toSend || pending > 0 {
		progress := false
		// Publish one chunk of my block if the ring has room.
		blocker := -1
		if sent < toSend {
			n := g.sent
			if n+1 > K && g.freeUpTo < n+1-K {
				blocker = g.refreshFree(n + 1 - K)
			}
			if blocker < 0 {
				c := o.chunk[me]
				lo := sent * c
				hi := min(lo+c, mySize)
				slot := int(n % K)
				copy(g.slots[me][slot], o.src[lo:hi])
				atomic.StoreUint64(g.stamps[me][slot], n+1)
				g.ringAll()
				g.sent++
				sent++
				progress = true
			}
		}
		// Read whatever chunks have arrived from each owner.
		waitFor := -1
		for p := range L {
			if !o.staged[p] {
				continue
			}
			for {
				n := g.recv[p]
				slot := int(n % K)
				if atomic.LoadUint64(g.stamps[p][slot]) != n+1 {
					if waitFor < 0 {
						waitFor = p
					}
					break
				}
				c := o.chunk[p]
				lo := o.next[p] * c
				hi := min(lo+c, o.sizes[p])
				base := o.offs[p]
				copy(o.dst[base+lo:base+hi], g.slots[p][slot][:hi-lo])
				g.recv[p] = n + 1
				atomic.StoreUint64(&g.myAcks[p].consumed, n+1)
				g.ring(p)
				progress = true
				if o.next[p]++; o.next[p] == o.count[p] {
					o.staged[p] = false
					pending--
					break
				}
			}
		}
		if progress {
			w.progress()
			continue
		}
		peer, what := waitFor, "a chunk"
		if peer < 0 {
			peer, what = blocker, "a free ring slot"
		}
		w.slept = false
		if err := w.idle(peer, what); err != nil {
			if q := o.heldBy(peer); peer == waitFor && q >= 0 && errors.Is(err, fault.ErrTimeout) {
				// The owner waits for a reader to free its ring: that
				// reader is late, not the owner (its own wait for the
				// reader times out about now, naming it), unless the
				// reader failed: then whom it gave up on.
				if why := g.lostHere(q); why != "" {
					why, culprit := g.follow(q, why)
					return fault.New(o.name, g.global(me), culprit, fault.ErrPeerLost,
						"%s (while this rank waited %v for a chunk of rank %d, whose ring rank %d had not freed)", why, w.budget, g.global(peer), g.global(q))
				}
				return fault.New(o.name, g.global(me), g.global(q), fault.ErrTimeout,
					"waited %v for a chunk of rank %d, whose ring rank %d has not freed", w.budget, g.global(peer), g.global(q))
			}
			return err
		}
		if w.slept {
			// Every owner still to be read and every reader still to free a
			// slot is a dependency: a lost one ends the wait.
			if err := w.checkAll(o.dependency, sent < toSend); err != nil {
				return err
			}
		}
	}

	if !ownCopied {
		copyBlock(o.dst[o.offs[me]:o.offs[me]+mySize], o.src, g.cfg.BigCopy, g.cfg.ShareCores)
	}

	// 4. A source read in place may change once this call returns: wait
	// until every reader has finished with it.
	if o.mode != modeStaged {
		for p := range L {
			if p == me {
				continue
			}
			for atomic.LoadUint64(&g.toMe[p].ack) != ackWord(e, ackDone) {
				if err := w.idle(p, "the acknowledgement of a zero-copy read"); err != nil {
					return err
				}
			}
			w.progress()
		}
	}
	// 5. A peer that gave up this call after it had published its block
	// (its context cancelled while it waited for a later rank) withdrew
	// it: the call ends on every rank, not only on those still waiting
	// for it. (One that gives up after this check is a cancel that lands
	// as the call ends.)
	for p := range L {
		if p != me && atomic.LoadUint64(&g.myAcks[p].ack) == ackWord(e, ackWithdrawn) {
			why, culprit := g.lost(p)
			if why == "" {
				why, culprit = g.follow(p, "peer gave up the call")
			}
			return fault.New(o.name, g.global(me), culprit, fault.ErrPeerLost, "%s after it had published its block", why)
		}
	}
	w.progress()
	return nil
}

// A block read in place (modeSymmetric, modeCMA) is acknowledged in the
// reader's ack word about its owner (ackLine.ack): the call's epoch
// shifted left by two, and its state. The reader claims the word before
// it copies (ackReading) and marks it done after (ackDone), each by a
// compare-and-swap; an owner that returns from a call without every
// reader's ackDone (an error of its own: a timeout waiting for a late
// rank) first withdraws the block by swapping in ackWithdrawn. Exactly
// one of the two wins each word: a reader that finds its block withdrawn,
// before or after its copy, fails the call instead of returning what the
// owner's memory holds after the owner let go of it. The swaps order
// the copy's loads before the reader's mark, and the owner's later stores
// after its withdrawal.
const (
	ackDone      = 0
	ackReading   = 1
	ackWithdrawn = 2
)

func ackWord(e, state uint64) uint64 { return e<<2 | state }

// claim marks this rank's read of owner p's block of call e begun, unless
// the owner has withdrawn it.
func (g *Group) claim(p int, e uint64) bool {
	l := g.myAcks[p]
	for {
		v := atomic.LoadUint64(&l.ack)
		if v>>2 >= e { // withdrawn: nothing else writes this epoch first
			return false
		}
		if atomic.CompareAndSwapUint64(&l.ack, v, ackWord(e, ackReading)) {
			return true
		}
	}
}

// copied marks the read of owner p's block of call e done, unless the
// owner withdrew it meanwhile (the copy may then hold what it wrote since).
func (g *Group) copied(p int, e uint64) bool {
	return atomic.CompareAndSwapUint64(&g.myAcks[p].ack, ackWord(e, ackReading), ackWord(e, ackDone))
}

// withdrawn is a read's error once owner p has withdrawn its block.
func (o *Op) withdrawn(p int) error {
	g := o.g
	why, culprit := g.lost(p)
	if why == "" {
		// Not yet marked failed: it withdraws first, having stored
		// whom it blames (Op.Run).
		why, culprit = g.follow(p, "peer gave up the call")
	}
	return fault.New(o.name, g.global(g.rank), culprit, fault.ErrPeerLost, "%s before this rank had read its block in place", why)
}

// withdraw takes this rank's block of call e, offered in place, back from
// every reader that has not finished copying it: it never waits.
func (o *Op) withdraw(e uint64) {
	g := o.g
	for p := range g.size {
		if p == g.rank {
			continue
		}
		l := g.toMe[p]
		for {
			v := atomic.LoadUint64(&l.ack)
			if v == ackWord(e, ackDone) || v>>2 > e || v == ackWord(e, ackWithdrawn) {
				break
			}
			if atomic.CompareAndSwapUint64(&l.ack, v, ackWord(e, ackWithdrawn)) {
				break
			}
		}
	}
}

// heldBy is the reader that holds owner p's ring full, so that p cannot
// publish the chunk this rank waits for, or -1 (the chunk is there, or p's
// ring has room: p itself is late).
func (o *Op) heldBy(p int) int {
	g := o.g
	if p < 0 || p == g.rank {
		return -1
	}
	n, K := g.recv[p], uint64(g.lay.K)
	if n+1 <= K || atomic.LoadUint64(g.stamps[p][int(n%K)]) == n+1 {
		return -1
	}
	for q := range g.size {
		if q != p && q != g.rank && atomic.LoadUint64(&g.lay.ack(g.mem, q, p).consumed) < n+1-K {
			return q
		}
	}
	return -1
}

// dependency reports whether this rank waits on peer p, and for what.
func (o *Op) dependency(p int, sending bool) (bool, string) {
	g := o.g
	if o.staged[p] {
		return true, "a chunk"
	}
	if sending && p != g.rank && g.sent+1 > uint64(g.lay.K) &&
		atomic.LoadUint64(&g.toMe[p].consumed) < g.sent+1-uint64(g.lay.K) {
		return true, "a free ring slot"
	}
	return false, ""
}

// refreshFree recomputes the minimum of the readers' consumed counters and
// returns a reader that has not yet consumed up to need, or -1.
func (g *Group) refreshFree(need uint64) int {
	lowest, who := ^uint64(0), -1
	for p := range g.size {
		if p == g.rank {
			continue
		}
		c := atomic.LoadUint64(&g.toMe[p].consumed)
		if c < lowest {
			lowest, who = c, p
		}
	}
	if who < 0 { // a group of one never shares its ring
		g.freeUpTo = need
		return -1
	}
	g.freeUpTo = lowest
	if lowest >= need {
		return -1
	}
	return who
}

// fail marks this rank as failed so that peers waiting on it stop at once,
// and breaks the group.
func (g *Group) fail(err error) {
	if g.ctrls != nil {
		g.noteBlame(err)
		atomic.StoreUint32(&g.ctrls[g.rank].state, stateFailed)
		g.ringAll()
	}
	g.broken = fault.New("communicator", g.global(g.rank), -1, fault.ErrClosed, "broken by an earlier error: %v", err)
}

// noteBlame stores in this rank's control line the peer that err names as
// lost or late, for the ranks that wait for this one (Group.lost).
func (g *Group) noteBlame(err error) {
	var oe *fault.OpError
	if g.ctrls != nil && errors.As(err, &oe) && oe.Peer >= 0 && oe.Peer != g.global(g.rank) &&
		(errors.Is(err, fault.ErrPeerLost) || errors.Is(err, fault.ErrTimeout)) {
		atomic.StoreUint32(&g.ctrls[g.rank].blame, uint32(oe.Peer)+1)
	}
}

// Barrier returns once every rank of the group has entered it.
func (g *Group) Barrier(ctx context.Context) error {
	if g.barrier == nil {
		z := make([]int, g.size)
		op, err := g.Plan("barrier", nil, nil, z, z)
		if err != nil {
			return err
		}
		g.barrier = op
	}
	return g.barrier.Run(ctx)
}

// peerBytes is the n bytes at off of rank p's part of symmetric buffer id.
func (g *Group) peerBytes(p, id, off, n int) ([]byte, error) {
	if id >= len(g.bufs) || g.bufs[id] == nil {
		return nil, fmt.Errorf("rank %d reads symmetric buffer %d, which this rank has not allocated", g.global(p), id)
	}
	b := g.bufs[id]
	if off < 0 || n > b.stride || off > b.stride-n { // off+n may wrap: off is the peer's word
		return nil, fmt.Errorf("rank %d's block (%d bytes at %d) overruns symmetric buffer %d", g.global(p), n, off, id)
	}
	base := p*b.stride + off
	return b.seg.Mem[base : base+n], nil
}

// RunMismatched takes part in the operation's protocol with a hash no peer
// shares, so that every rank of the group returns ErrSizeMismatch and no
// data moves. A rank that learned of a mismatch elsewhere (from another
// node) uses it to pass the verdict on without leaving its peers to time
// out.
func (o *Op) RunMismatched(ctx context.Context) error {
	o.hash ^= mismatchSalt
	err := o.Run(ctx)
	o.hash ^= mismatchSalt
	return err
}

const mismatchSalt = 0x6d69736d61746368 // "mismatch"

// announceMismatched publishes this rank's header of the next call with a
// hash no peer shares, and returns without waiting for the peers: each of
// them returns ErrCallsDiffer from that call, naming this rank. Nothing
// moves, so the plan's blocks must all be empty. (A header is rewritten
// only two calls later, once every peer has published the next one, so
// it stays there until every peer has read it.)
func (o *Op) announceMismatched() {
	g := o.g
	e := g.epoch + 1
	g.epoch = e
	h := g.hdrs[g.rank][int(e&1)]
	h.size, h.hash, h.mode, h.zcBuf, h.zcOff = 0, o.hash^mismatchSalt, modeStaged, 0, 0
	atomic.StoreUint64(&h.epoch, e)
	g.ringAll()
}

// Abandon marks this rank as failed: peers waiting on it get ErrPeerLost at
// once, and every later call returns ErrClosed. A caller that fails outside
// the group (a network error) uses it so that its node does not wait for it.
func (g *Group) Abandon(err error) {
	if !g.closed {
		g.fail(err)
	}
}
