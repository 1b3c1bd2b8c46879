package p2p

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/slimego/slimego/device"
)

// Leases: one-sided copies on the same host, with no request per transfer.
//
// A grant (cma_linux.go) lends a request's ranges for one copy, which
// costs the initiator a round trip over the link's sockets before it may
// copy: most of a same-host transfer's time below a few MiB. A lease lends
// a whole region until the target takes it back. The initiator asks for
// one (rLease: a read request of the region whole, checked by the target
// as any other: registered, not deregistered, the right key) the first
// time a batch of its host memory names a region of a same-host peer; the
// batch itself goes the usual way meanwhile. Once the lease is granted,
// every later batch whose ranges all lie in leased regions, under the keys
// the leases were granted for, is copied by the initiator at once: through
// its mapping of the region's Shared memory (zero copy), or with
// process_vm_readv/writev at the region's address. A batch with any other
// range (a wrong key, a region not leased) goes the usual way, so that
// the target checks it and refuses it on both sides.
//
// The target revokes a lease when its region is deregistered (kRevoke,
// sent on the connection that carried the grant, so after it). The
// initiator stops starting copies through it at once, and releases it
// (kRelease) when the copies it pinned end; until then Deregister waits,
// as it waits for a grant. A link that fails ends its leases as it ends
// its grants: the target counts them in use for a heartbeat more, and the
// initiator's copies stop at their next chunk.
//
// A batch whose local ranges are GPU memory of one device asks, and
// copies through, leases of the peer's GPU memory instead (rLeaseG): the
// grant is an IPC record of the region's allocation, which the initiator
// opens on its device and keeps open while the lease lives, and closes
// before it releases it, so that the target may free the memory once its
// Deregister returns. A lease serves batches of the memory it was asked
// for only (host memory here, or GPU memory of that device).
//
// All of a link's lease state is under its mu.

// testHookLeaseOpen, set by a test, runs where a granted GPU lease's
// allocation is about to be opened (outside l.mu).
var testHookLeaseOpen func()

// maxLeases bounds the regions of a peer a link holds or asks leases of,
// or was refused for a cause that may pass (an entry is never reused, as
// region ids are not): past it, batches go the usual way. Regions gone
// for good (their leases revoked, or refused as deregistered) do not
// count: a peer that evicts blocks and registers new ones for the life of
// the link (a decode worker's KV cache) would otherwise leave every
// region after its first maxLeases unleased. Up to maxLeases of their
// entries are kept, so that a batch that names one (raced its eviction)
// goes the usual way to its refusal without asking a lease again.
const maxLeases = 1024

// maxGPULeases bounds the leases of GPU regions a link asks (each keeps
// an allocation open, within maxIPCMaps, which grants need too).
const maxGPULeases = maxIPCMaps / 2

// lease is a region of the peer's that this side asked a lease of.
type lease struct {
	id       uint64 // the lease request's id
	ch       int    // the connection it was asked on
	region   RemoteRegion
	answered bool     // its answer came (a second one breaks the protocol)
	ready    bool     // granted: g is the region's memory
	dead     bool     // refused, revoked, or the link ended: no copies start
	released bool     // given back (or never granted): nothing is held
	g        grantIov // the region whole; g.m its mapping, if mapped
	inflight int      // copies through it now
	// gpu: asked for batches of GPU memory of this device (rLeaseG);
	// once granted, ipc is the peer's allocation opened on it and
	// ipcOff the region's offset in it.
	gpu    *device.GPU
	ipc    *ipcMap
	ipcOff uint64
}

// pinLeases returns, for a batch of host memory (gpu nil) or of GPU
// memory of device gpu on a same-host link, the lease of each op's
// region, each pinned against release, when every one is granted for the
// op's key and size and for that memory (unpin them when the copy ends);
// or nil, having asked leases of regions that have none yet.
func (l *link) pinLeases(ops []Op, gpu *device.GPU) []*lease {
	var ask []*lease
	l.mu.Lock()
	if l.leases == nil {
		l.leases, l.gpuLeases, l.leaseIDs = map[uint64]*lease{}, map[uint64]*lease{}, map[uint64]*lease{}
	}
	// Leases of host and of GPU memory apart: a region's lease serves
	// the batches of the memory it was asked for.
	leases, most := l.leases, maxLeases+len(l.goneLeases)
	if gpu != nil {
		leases, most = l.gpuLeases, maxGPULeases+len(l.goneGPULeases)
	}
	alive := l.err == nil && !l.leasesGone
	ok := alive
	for _, o := range ops {
		ls := leases[o.Remote.ID]
		// A size the target would not take (a RemoteRegion made up by
		// the caller) is not asked for: its request would break the
		// protocol; the batch goes the usual way and is refused there.
		if ls == nil && alive && len(leases) < most && o.Remote.Size > 0 && o.Remote.Size <= MaxLen {
			ls = &lease{id: l.nextID, ch: l.rr, region: o.Remote, gpu: gpu}
			l.nextID++
			l.rr = (l.rr + 1) % len(l.conns)
			leases[o.Remote.ID] = ls
			l.leaseIDs[ls.id] = ls
			ask = append(ask, ls)
		}
		if ls == nil || !ls.ready || ls.dead || ls.region != o.Remote || gpu != nil && ls.gpu.Ordinal != gpu.Ordinal {
			ok = false
		}
	}
	var pins []*lease
	if ok {
		pins = make([]*lease, len(ops))
		for i, o := range ops {
			pins[i] = leases[o.Remote.ID]
			pins[i].inflight++
		}
	}
	l.mu.Unlock()
	for _, ls := range ask {
		l.askLease(ls)
	}
	return pins
}

// askLease sends ls's request: a read request of the region whole.
func (l *link) askLease(ls *lease) {
	sub := rLease
	if ls.gpu != nil {
		sub = rLeaseG
	}
	b := appendHeader(nil, header{kind: kReq, sub: sub, id: ls.id, a: ls.region.Size, b: 1, payload: stripeSize + DescSize})
	b = binary.LittleEndian.AppendUint64(b, 0)
	b = append(b, make([]byte, DescSize)...)
	d := desc{region: ls.region.ID, key: ls.region.Key, off: 0, len: ls.region.Size}
	d.put(b[len(b)-DescSize:])
	if !l.conns[ls.ch].direct(false, func(out []byte) []byte { return append(out, b...) }) {
		l.enqueue(ls.ch, rawJob{b: b})
	}
}

// unpinLeases drops the pins pinLeases took; a lease revoked meanwhile is
// released by its last one.
func (l *link) unpinLeases(pins []*lease) {
	var rel []*lease
	var doomed []*ipcMap
	l.mu.Lock()
	for _, ls := range pins {
		ls.inflight--
		if l.endLeaseLocked(ls, &doomed) {
			rel = append(rel, ls)
		}
	}
	l.mu.Unlock()
	l.closeIPC(doomed)
	for _, ls := range rel {
		l.releaseLease(ls)
	}
}

// endLeaseLocked gives ls back once it is dead and no copy uses it:
// its mapping's reference is dropped (an IPC allocation no one uses any
// more is added to doomed, for the caller to close, outside l.mu, before
// the release goes), and it reports whether the target is to be told
// (kRelease; not once the link has ended).
func (l *link) endLeaseLocked(ls *lease, doomed *[]*ipcMap) bool {
	// One not granted yet is ended by its answer (leaseAnswered), which
	// finds it dead: what the answer grants is then given back. (An
	// answer being taken in, its memory mapped or opened outside l.mu,
	// is not granted yet either.)
	if !ls.dead || ls.inflight > 0 || ls.released || !ls.ready {
		return false
	}
	ls.released = true
	if ls.g.m != nil {
		ls.g.m.refs--
		l.dropUnused(ls.g.m)
		ls.g.m = nil
	}
	if ls.ipc != nil {
		l.unrefIPCLocked(ls.ipc, doomed)
		ls.ipc = nil
	}
	return l.err == nil
}

// leaseAnswered handles the answer to lease request h.id (its grant's one
// iovec follows h when granted).
func (c *conn) leaseAnswered(h header) error {
	l := c.l
	var iov [IovSize]byte
	var rec [IPCRecSize]byte
	if h.status == stOK {
		b := iov[:]
		if h.sub == rLeaseG {
			b = rec[:]
		}
		if err := c.readFull(b); err != nil {
			return err
		}
	}
	l.mu.Lock()
	ls := l.leaseIDs[h.id]
	if ls == nil || ls.answered || ls.ch != c.idx || (ls.gpu != nil) != (h.sub == rLeaseG) {
		l.mu.Unlock()
		return fmt.Errorf("%w: an answer of kind %d to lease %d on connection %d, never asked so there or answered already", ErrFrame, h.sub, h.id, c.idx)
	}
	ls.answered = true
	if h.status != stOK {
		ls.dead, ls.released = true, true
		delete(l.leaseIDs, h.id)
		if h.status == stNoRegion || h.status == stClosing {
			l.goneLocked(ls)
		}
		l.mu.Unlock()
		return nil
	}
	l.mu.Unlock()
	if ls.gpu != nil {
		return c.ipcLeaseAnswered(ls, rec[:])
	}
	g := grantIov{addr: binary.LittleEndian.Uint64(iov[:]), n: binary.LittleEndian.Uint64(iov[8:]),
		mem: binary.LittleEndian.Uint64(iov[16:]), off: binary.LittleEndian.Uint64(iov[24:]), fd: binary.LittleEndian.Uint32(iov[32:])}
	zero := binary.LittleEndian.Uint32(iov[36:])
	if g.n != ls.region.Size || g.off > MaxLen || zero != 0 || g.mem == 0 && (g.off != 0 || g.fd != 0) || g.addr+g.n < g.addr {
		return fmt.Errorf("%w: a lease of %d bytes for a region of %d (memory %#x, offset %d, fd %d)", ErrFrame, g.n, ls.region.Size, g.mem, g.off, g.fd)
	}
	if g.mem != 0 {
		// A memory that cannot be mapped is copied at its address, as
		// for a grant.
		if m, err := l.mapPeer(g.mem, g.fd, g.off+g.n); err == nil {
			g.m = m
		}
	}
	l.mu.Lock()
	ls.g, ls.ready = g, true
	rel := false
	if l.err != nil || ls.dead { // ended meanwhile (the link, or this side's Close): the mapping goes
		ls.dead = true
		rel = l.endLeaseLocked(ls, new([]*ipcMap)) // host memory: nothing to close
	}
	l.mu.Unlock()
	if rel {
		l.releaseLease(ls)
	}
	return nil
}

// revoked handles the target's kRevoke of lease id: no copy starts
// through it any more, and it is released once the running ones end.
func (l *link) revoked(id uint64) {
	l.mu.Lock()
	ls := l.leaseIDs[id]
	if ls == nil || !ls.ready {
		l.mu.Unlock()
		return
	}
	delete(l.leaseIDs, id)
	ls.dead = true
	var doomed []*ipcMap
	rel := l.endLeaseLocked(ls, &doomed)
	l.goneLocked(ls)
	l.mu.Unlock()
	l.closeIPC(doomed)
	if rel {
		l.releaseLease(ls)
	}
}

// goneLocked records that ls's region is gone for good (revoked, or
// refused as deregistered), so that its entry no longer counts against
// maxLeases, and forgets the oldest such entries past maxLeases once
// they are released (one a copy still pins stays until a later call).
func (l *link) goneLocked(ls *lease) {
	leases, gone := l.leases, &l.goneLeases
	if ls.gpu != nil {
		leases, gone = l.gpuLeases, &l.goneGPULeases
	}
	if leases[ls.region.ID] != ls {
		return
	}
	*gone = append(*gone, ls.region.ID)
	for len(*gone) > maxLeases {
		old := leases[(*gone)[0]]
		if old != nil && !old.released {
			break
		}
		delete(leases, (*gone)[0])
		*gone = (*gone)[1:]
	}
}

// giveBackLeases ends this side's leases (its endpoint closes): none is
// used for a copy from now on, and those no copy uses are released at
// once, so that the peer's Deregister need not wait for the link's end.
// Where a connection's writer is still busy when the flush gives up, a
// release may not leave before the connections close; the peer then
// waits as for a link that failed.
func (l *link) giveBackLeases() {
	var rel []*lease
	var doomed []*ipcMap
	l.mu.Lock()
	l.leasesGone = true // none is asked from now on (pinLeases)
	leased := len(l.leases)+len(l.gpuLeases) > 0
	for _, leases := range []map[uint64]*lease{l.leases, l.gpuLeases} {
		for _, ls := range leases {
			ls.dead = true
			if l.endLeaseLocked(ls, &doomed) {
				rel = append(rel, ls)
			}
		}
	}
	l.mu.Unlock()
	l.closeIPC(doomed)
	for _, ls := range rel {
		l.releaseLease(ls)
	}
	if !leased { // nothing was leased on this link: nothing to send
		return
	}
	// A lease asked and not answered yet is given back by its answer
	// (leaseAnswered finds it dead), one a copy pins by the copy's end
	// (unpinLeases): both are waited for, briefly, so that their releases
	// too leave before the links close. Then what was queued (these
	// releases, and those of leases released before, a revocation's)
	// leaves.
	end := time.Now().Add(min(l.hb/2, time.Second))
	for time.Now().Before(end) && l.leasesHeld() {
		time.Sleep(time.Millisecond)
	}
	l.flush(time.Until(end) + time.Millisecond)
}

// endGrantCopies waits until end for this side's copies through the
// peer's grants to queue their releases (Close has finished their parts:
// each stops at its next chunk), then for the releases to leave. The
// peer cannot tell a release lost with the link from a copy still going
// in a process that runs, and would hold its regions until a heartbeat
// after the link's end. A link with no such copy sends nothing and does
// not wait.
func (l *link) endGrantCopies(end time.Time) {
	if l.grantCopies.Load() == 0 {
		return
	}
	for time.Now().Before(end) && l.grantCopies.Load() > 0 && l.failed() == nil {
		time.Sleep(time.Millisecond)
	}
	l.flush(time.Until(end) + time.Millisecond)
}

// leasesHeld says whether a lease of this side's is not given back yet
// while the link lives.
func (l *link) leasesHeld() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return false
	}
	for _, leases := range []map[uint64]*lease{l.leases, l.gpuLeases} {
		for _, ls := range leases {
			if !ls.released {
				return true
			}
		}
	}
	return false
}

// releaseLease tells the target that ls is given back, on every
// connection: the target fails the link at the first connection's end it
// reads, which may be another's than the lease's, and a release still
// unread behind it would be lost (the target would then count the region
// as lent for a heartbeat more); each connection's reader reads its
// release before its end. A release of a lease already given back is
// ignored.
func (l *link) releaseLease(ls *lease) {
	for ch := range l.conns {
		l.enqueue(ch, frame{kind: kRelease, id: ls.id})
	}
}

// flush waits, up to d, until every connection's writer has written what
// was queued for it (so that frames queued just before the link is closed
// leave first).
func (l *link) flush(d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(time.Millisecond) {
		idle := true
		for _, c := range l.conns {
			c.qmu.Lock()
			idle = idle && (len(c.q) == 0 && !c.busy || c.dead)
			c.qmu.Unlock()
		}
		if idle {
			return
		}
	}
}

// mapped reports whether every one of pins copies through a mapping
// (Shared memory), which no peer can make wait: a process_vm copy can be
// made to wait (on pages a userfaultfd of the peer's holds back).
func mapped(pins []*lease) bool {
	for _, ls := range pins {
		if ls.g.m == nil && ls.ipc == nil {
			return false
		}
	}
	return true
}

// endLeases ends every lease when the link has ended (nothing copies
// any more, or will: the copies' parts are finished), under l.mu; it
// returns the allocations to close.
func (l *link) endLeases() []*ipcMap {
	var doomed []*ipcMap
	for _, leases := range []map[uint64]*lease{l.leases, l.gpuLeases} {
		for _, ls := range leases {
			ls.dead = true
			l.endLeaseLocked(ls, &doomed)
		}
	}
	return doomed
}

// leaseJob is a batch's ranges in its leased regions (leaseRanges).
type leaseJob struct {
	rem  []grantIov // host memory
	recs []ipcRec   // GPU memory (pinLeases: all alike)
	maps []*ipcMap
}

// leaseRanges takes a batch's ranges in its pinned leases (one per op)
// from ops, in the calling goroutine, as the call checked them: the
// caller may reuse ops once its call has returned, and a copy that read
// them later would go wherever they then said, unchecked.
func leaseRanges(ops []Op, pins []*lease) leaseJob {
	if pins[0].ipc != nil {
		j := leaseJob{recs: make([]ipcRec, len(ops)), maps: make([]*ipcMap, len(ops))}
		for i, o := range ops {
			j.recs[i] = ipcRec{off: pins[i].ipcOff + uint64(o.RemoteOff), n: uint64(o.Len)}
			j.maps[i] = pins[i].ipc
		}
		return j
	}
	j := leaseJob{rem: make([]grantIov, len(ops))}
	for i, o := range ops {
		g := pins[i].g
		at := uint64(o.RemoteOff)
		j.rem[i] = grantIov{addr: g.addr + at, n: uint64(o.Len), mem: g.mem, off: g.off + at, fd: g.fd, m: g.m}
	}
	return j
}

// leaseCopyTracked is leaseCopy in a goroutine that track counted.
func (l *link) leaseCopyTracked(p *part, j leaseJob, pins []*lease, write bool) {
	defer l.wg.Done()
	l.leaseCopy(p, j, pins, write)
}

// leaseCopy copies a batch through its pinned leases as part p: the
// ranges j took, in order.
func (l *link) leaseCopy(p *part, j leaseJob, pins []*lease, write bool) {
	if j.recs != nil { // GPU memory
		err := ipcCopy(p, j.recs, j.maps, write)
		l.unpinLeases(pins)
		if err != nil {
			p.finish(opErr(p.f.op, l.p.name, p.f.label(), ErrInvalid, "copying GPU memory through a lease: %v", err))
			return
		}
		p.finish(nil)
		return
	}
	rem := j.rem
	err := l.grantCopy(p, rem, write)
	l.unpinLeases(pins)
	if err != nil {
		p.finish(opErr(p.f.op, l.p.name, p.f.label(), ErrPeerLost, "copying through a lease: %v", err))
		return
	}
	// A copy through a mapping of the peer's Shared memory succeeds into
	// the memory of a peer that has exited (the mapping outlives it): once
	// the link knows the peer is gone, the batch is not reported done.
	if lerr := l.failed(); lerr != nil {
		p.finish(asOp(p.f.op, l.p.name, lerr))
		return
	}
	p.finish(nil)
}

// revokeLeases takes back the leases of r that the endpoint's peers hold
// (Deregister), on the connections that granted them.
func (e *Endpoint) revokeLeases(r *Region) {
	e.mu.Lock()
	var links []*link
	for _, p := range e.peers {
		if p.l != nil {
			links = append(links, p.l)
		}
	}
	e.mu.Unlock()
	for _, l := range links {
		l.revokeLocal(r)
	}
}

// revokeLocal revokes the leases of r this link granted.
func (l *link) revokeLocal(r *Region) {
	type rv struct {
		id uint64
		ch int
	}
	var out []rv
	l.mu.Lock()
	for id, ch := range l.leased {
		if regs := l.grants[id]; len(regs) == 1 && regs[0] == r {
			delete(l.leased, id)
			out = append(out, rv{id, ch})
		}
	}
	l.mu.Unlock()
	for _, v := range out {
		l.enqueue(v.ch, frame{kind: kRevoke, id: v.id})
	}
}
