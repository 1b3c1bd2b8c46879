package p2p

import (
	"fmt"

	"github.com/slimego/slimego/inter"
)

// Read copies, for each op, Len bytes at RemoteOff of the peer's region
// Remote into Local at LocalOff. The peer checks every range against its
// regions and keys first; a refused batch reads nothing (ErrRefused).
// Until Wait returns, the local ranges must not be touched.
func (p *Peer) Read(ops []Op) *Future { return p.oneSided("read", rRead, ops, nil) }

// Write copies, for each op, Len bytes at LocalOff of Local into the
// peer's region Remote at RemoteOff. A refused batch writes nothing.
func (p *Peer) Write(ops []Op) *Future { return p.oneSided("write", rWrite, ops, nil) }

// WriteWithImm is Write, after which the peer receives imm (Endpoint.Imm)
// once every byte of the batch is in its regions. Wait returns nil once
// the peer has taken the immediate in. The peer never receives imm
// without the bytes; but where Wait ends early (its context) after the
// request went out, the peer may still receive both (a batch of one
// stripe over TCP carries imm in its request), so a caller that retries
// after ErrCancelled or ErrTimeout must expect the immediate twice.
// Only this batch's bytes are ordered before imm: a Write to the same
// peer started earlier, whose Wait has not returned, may land after the
// peer has taken imm (put such pages in this batch, or wait for them
// first). A batch of no operations sends imm alone (a signal that
// carries no bytes, as a zero-length write with immediate does on RDMA).
func (p *Peer) WriteWithImm(ops []Op, imm uint32) *Future {
	if len(ops) == 0 && p.made() {
		return p.immAlone(imm)
	}
	return p.oneSided("writeimm", rWrite, ops, &imm)
}

// immAlone is WriteWithImm of no operations: the immediate's request
// alone, over TCP.
func (p *Peer) immAlone(imm uint32) *Future {
	l := p.l
	f := newFuture("writeimm", p.name, "tcp")
	l.mu.Lock()
	ch := l.rr
	l.rr = (l.rr + 1) % len(l.conns)
	l.mu.Unlock()
	pt := &part{l: l, f: f, kind: rImm, sub: rImm, ch: ch, reqCh: ch, imm: imm, active: true}
	f.parts = []*part{pt}
	f.left.Store(1)
	if ff := l.register(f.parts, l.parts); ff != nil {
		return ff
	}
	l.submit(pt)
	return f
}

// cmaMin is the most a batch moves over TCP on a same-host link: a grant
// costs a round trip like a TCP request's, and then a copy and a release
// besides, where a small batch's bytes ride in the answer (or the
// request) itself.
const cmaMin = directMax - 2*HeaderSize

// check validates a batch on this side.
func (p *Peer) check(op string, ops []Op) (uint64, error) {
	if len(ops) == 0 || len(ops) > MaxBatch {
		return 0, opErr(op, p.name, "", ErrInvalid, "a batch of %d operations (1 to %d)", len(ops), MaxBatch)
	}
	var total uint64
	for i, o := range ops {
		if o.Local == nil || o.Local.e != p.e {
			return 0, opErr(op, p.name, "", ErrInvalid, "operation %d: its local region is not this endpoint's (%q): %s", i, p.e.opts.Name, o.Local.whose())
		}
		if o.Len <= 0 {
			return 0, opErr(op, p.name, "", ErrInvalid, "operation %d: a length of %d (1 byte or more)", i, o.Len)
		}
		if o.LocalOff < 0 || o.LocalOff > o.Local.size-o.Len {
			return 0, opErr(op, p.name, o.Local.label(), ErrInvalid, "operation %d: %d bytes at %d of a local region of %d", i, o.Len, o.LocalOff, o.Local.size)
		}
		if o.RemoteOff >= 0 && uint64(o.RemoteOff) > MaxLen {
			// No region is larger (a RemoteRegion made up by the
			// caller may say it is): the target would take such a
			// descriptor for a broken frame and end the link.
			return 0, opErr(op, p.name, fmt.Sprintf("%q", o.Remote.Name), ErrInvalid, "operation %d: an offset of %d, past the largest region (%d bytes)", i, o.RemoteOff, uint64(MaxLen))
		}
		if o.RemoteOff < 0 || uint64(o.RemoteOff) > o.Remote.Size || uint64(o.Len) > o.Remote.Size-uint64(o.RemoteOff) {
			return 0, opErr(op, p.name, fmt.Sprintf("%q", o.Remote.Name), ErrInvalid, "operation %d: %d bytes at %d of a remote region of %d", i, o.Len, o.RemoteOff, o.Remote.Size)
		}
		total += uint64(o.Len)
	}
	if total > MaxLen {
		return 0, opErr(op, p.name, "", ErrInvalid, "a batch of %d bytes", total)
	}
	return total, nil
}

func (p *Peer) oneSided(op string, kind uint8, ops []Op, imm *uint32) *Future {
	if !p.made() {
		return failed(op, "", errZeroPeer(op))
	}
	total, err := p.check(op, ops)
	if err != nil {
		return failed(op, p.name, err)
	}
	l := p.l
	f := newFuture(op, p.name, l.name())
	if name := ops[0].Remote.Name; name != "" {
		f.region = name // quoted when an error names it (label)
	}
	for _, o := range ops[1:] {
		if o.Remote.ID != ops[0].Remote.ID {
			f.region = "" // several: the error names none (the target's OnRefuse names the descriptor)
			break
		}
	}
	n := len(l.conns)
	k := inter.Stripes(int(min(total, MaxLen)), n)
	sub := kind
	// allGPU: every local range is GPU memory of one device (IPC opens
	// the peer's memory on that device).
	gpu, allGPU := false, true
	for _, o := range ops {
		gpu = gpu || o.Local.dev != nil
		allGPU = allGPU && o.Local.dev != nil && o.Local.dev.Dev.Ordinal == ops[0].Local.dev.Dev.Ordinal
	}
	var pins []*lease
	switch {
	case !l.cma.Load():
	case !gpu:
		pins = l.pinLeases(ops, nil)
	case allGPU && !l.ipcOff.Load():
		pins = l.pinLeases(ops, ops[0].Local.dev.Dev)
	}
	if pins != nil { // copied here through leases (lease_linux.go)
		k, sub = 1, rLease
		if pins[0].ipc != nil {
			f.transport = "ipc"
		}
	} else if allGPU && total > cmaMin && l.cma.Load() && !l.ipcOff.Load() {
		// Same host, GPU memory here: the peer's GPU memory through CUDA
		// IPC (ipc.go), or over TCP if it is not GPU memory.
		k, f.transport = 1, "ipc"
		sub = map[uint8]uint8{rRead: rReadG, rWrite: rWriteG}[kind]
	} else if gpu || total <= cmaMin {
		f.transport = "tcp"
	} else if l.cma.Load() { // one request: vmCopy shares its copy out among threads
		k = 1
		sub = map[uint8]uint8{rRead: rReadV, rWrite: rWriteV}[kind]
	}
	l.mu.Lock()
	first := l.rr
	l.rr = (l.rr + k) % n
	l.mu.Unlock()
	// Cut the batch's bytes into k contiguous stripes, one request each.
	// Every request carries the whole batch's descriptors, so that the
	// target accepts or refuses every stripe alike: a refused batch writes
	// nothing anywhere.
	descs := f.one.descs[:0:1]
	if len(ops) > 1 {
		descs = make([]desc, len(ops))
	}
	descs = descs[:len(ops)]
	for i, o := range ops {
		descs[i] = desc{region: o.Remote.ID, key: o.Remote.Key, off: uint64(o.RemoteOff), len: uint64(o.Len)}
	}
	parts := f.one.parts[:0:1]
	i, off := 0, 0 // the op and the offset in it where the next stripe starts
	for s := range k {
		lo, hi := inter.Stripe(int(total), k, s)
		var pt *part
		if s == 0 {
			pt = &f.one.part
			pt.local, pt.regs = f.one.local[:0:1], f.one.regs[:0:1]
		} else {
			pt = new(part)
		}
		pt.l, pt.f, pt.kind, pt.sub, pt.ch, pt.lo, pt.total, pt.descs, pt.active = l, f, kind, sub, (first+s)%n, uint64(lo), uint64(hi-lo), descs, true
		pt.reqCh = pt.ch
		for need := hi - lo; need > 0; {
			o := ops[i]
			m := min(need, o.Len-off)
			pt.local = append(pt.local, o.Local.seg().sub(o.LocalOff+off, m))
			if len(pt.regs) == 0 || pt.regs[len(pt.regs)-1] != o.Local {
				pt.regs = append(pt.regs, o.Local)
			}
			need -= m
			off += m
			if off == o.Len {
				i, off = i+1, 0
			}
		}
		parts = append(parts, pt)
	}
	var then *part
	if imm != nil && len(parts) == 1 && parts[0].sub == rWrite { // not a lease's copy (rLease) nor a grant
		// One stripe over TCP: the immediate rides in its request, which
		// the target answers once both are done (one round trip, not
		// two).
		parts[0].withImm, parts[0].imm = true, *imm
	} else if imm != nil {
		then = &part{l: l, f: f, kind: rImm, sub: rImm, ch: first, reqCh: first, imm: *imm, active: true}
		f.then = then
		f.writesLeft.Store(int32(len(parts)))
		parts = append(parts, then)
	}
	f.parts = parts
	f.left.Store(int32(len(parts)))
	all := pins == nil && then == nil && together(parts)
	if all {
		for _, pt := range parts {
			pt.reqCh = first
		}
	}
	if ff := l.register(parts, l.parts); ff != nil {
		if pins != nil {
			l.unpinLeases(pins)
		}
		return ff
	}
	if all {
		l.requestAll(parts)
		return f
	}
	for _, pt := range parts {
		switch {
		case pt == then:
		case pins == nil:
			l.request(pt)
		case total <= leaseInline && mapped(pins):
			l.leaseCopy(pt, leaseRanges(ops, pins), pins, kind == rWrite)
		default:
			if !l.track() {
				l.unpinLeases(pins)
				pt.finish(asOp(f.op, l.p.name, l.failed()))
				continue
			}
			go l.leaseCopyTracked(pt, leaseRanges(ops, pins), pins, kind == rWrite) // its arguments are taken here, before the call returns
		}
	}
	return f
}

// leaseInline is the most a batch copied through leases of Shared memory
// copies in the calling goroutine, before the call returns (a fraction of
// a millisecond of copying, which nothing can make wait): handing it to a
// goroutine and waking the caller's Wait afterwards cost two wake-ups, as
// much as copying 1 MiB. A larger batch, and any process_vm copy (which a
// peer can make wait on its pages), is copied in a goroutine of its own,
// so that the call returns at once and the copy can be cancelled.
const leaseInline = cmaChunk

// register gives parts their ids and records them in m and in their local
// regions; if the link has failed or a region is deregistered, the call
// fails instead.
func (l *link) register(parts []*part, m map[uint64]*part) *Future {
	f := parts[0].f
	l.mu.Lock()
	if l.err != nil {
		err := l.err
		l.mu.Unlock()
		return failed(f.op, f.peer, f.named(err))
	}
	for _, pt := range parts {
		pt.id = l.nextID
		l.nextID++
		m[pt.id] = pt
	}
	l.mu.Unlock()
	for _, pt := range parts {
		for _, r := range pt.regs {
			r.mu.Lock()
			closed := r.closed.Load()
			if !closed {
				r.users[pt] = struct{}{}
			}
			r.mu.Unlock()
			if closed {
				// Region names the transfer's (the peer's) region, as
				// every other error of the transfer does; this side's
				// is in the text (as withdraw's is).
				pt.finish(opErr(f.op, f.peer, f.label(), ErrClosed, "this side's region %s is deregistered", r.label()))
				return f
			}
		}
	}
	return nil
}

// Send sends buf to the peer, to be received by the peer's Recv of the
// same rank in order (the first Send by the first Recv, and so on). Its
// bytes move once the receive is posted; Wait returns nil once they are in
// the receiver's buffer. buf must not be touched until Wait returns.
// A send announced while 65536 of this side's sends wait for the peer's
// receives fails with ErrRefused, and so does the peer's Recv of its rank
// (at once, while the peer remembers fewer than 65536 such refusals; else
// at its deadline): post receives, or wait for sends, before sending more.
func (p *Peer) Send(buf []byte) *Future {
	if !p.made() {
		return failed("send", "", errZeroPeer("send"))
	}
	if uint64(len(buf)) > MaxLen {
		return failed("send", p.name, opErr("send", p.name, "", ErrInvalid, "%d bytes", len(buf)))
	}
	l := p.l
	f := newFuture("send", p.name, "tcp") // a message always crosses the link's TCP connections
	pt := &part{l: l, f: f, kind: rSend, total: uint64(len(buf)), local: []seg{host(buf)}, active: true}
	f.parts = []*part{pt}
	f.left.Store(1)
	l.mu.Lock()
	if l.err != nil {
		err := l.err
		l.mu.Unlock()
		return failed("send", p.name, err)
	}
	pt.id = l.sendSeq
	l.sendSeq++
	l.sends[pt.id] = pt
	l.mu.Unlock()
	l.enqueue(int(pt.id%uint64(len(l.conns))), frame{kind: kReq, sub: rRTS, id: pt.id, a: pt.total})
	return f
}

// Recv receives the peer's next Send into buf, which must hold it (a
// larger message fails both sides with ErrRefused); Future.Len is its
// length. buf must not be touched until Wait returns.
func (p *Peer) Recv(buf []byte) *Future {
	if !p.made() {
		return failed("recv", "", errZeroPeer("recv"))
	}
	l := p.l
	f := newFuture("recv", p.name, "tcp")
	pt := &part{l: l, f: f, kind: rCTS, total: uint64(len(buf)), local: []seg{host(buf)}, active: true}
	f.parts = []*part{pt}
	f.left.Store(1)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return failed("recv", p.name, l.err)
	}
	pt.id = l.recvSeq
	l.recvSeq++
	if _, ok := l.rtsRefused[pt.id]; ok {
		// Its send came while too many were announced, and was refused:
		// it will not come again.
		delete(l.rtsRefused, pt.id)
		return failed("recv", p.name, opErr("recv", p.name, "", ErrRefused, "the peer's send of this rank (%d) was refused: it came while %d sends were announced before their receives", pt.id, maxPendingRTS))
	}
	l.recvs[pt.id] = pt
	if n, ok := l.rts[pt.id]; ok {
		delete(l.rts, pt.id)
		l.matchLocked(pt, n)
	}
	return f
}

func (l *link) submit(p *part) { l.request(p) }
