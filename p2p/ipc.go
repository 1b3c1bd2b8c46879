package p2p

import (
	"fmt"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/kernels"
)

// The same-host transport for GPU memory (CUDA IPC). An initiator whose
// local ranges are all GPU memory, on a same-host link (cma) to another
// process, asks with rReadG or rWriteG. The target checks the request as
// any other; where every range of the stripe is GPU memory it answers
// with an IPC handle of each range's allocation and the range's offset in
// it (slime_mem_range), and counts the request in flight on its regions
// until the initiator releases the grant, as for host memory. The
// initiator opens each handle for the grant (the grants in flight share
// an open; the last to end closes it, before its release, so that the
// peer may free the memory once it is released), checks each range against
// the size of the allocation it opened (the driver's word, not the
// peer's), and copies device to device a chunk at a time under its
// part's lock while the part is active, so that a cancelled transfer
// stops touching either side's memory at its next chunk. A range that is
// not GPU memory is answered stNotHost, and a handle that does not open
// here (a device this process cannot see, a container without the
// peer's IPC namespace) is released unused: either way the request goes
// again over TCP, staged through host memory, and after a handle that did
// not open so do the link's later transfers of GPU memory (ipcOff, set
// from the start where the peer is this process, which cannot open its
// own handles). GPU memory is leased as host memory is (lease_linux.go):
// a batch of this side's GPU memory asks a lease of the peer's GPU region
// (rLeaseG), which keeps its allocation open until it is revoked, and
// later batches copy through it with no request.
//
// A handle names memory of the process that exported it; CUDA gives the
// importer no way to tell which process that was. A member of the job
// (it passed the link's handshake) could grant memory that a third
// process exported to it; the ranges are still bounded by what the
// handle maps.

// testHookIPCOpen and testHookIPCClose, set by tests, run just before an
// allocation of the peer's is opened, and before allocations no grant
// uses any more are closed (closeIPC).
var testHookIPCOpen, testHookIPCClose func()

// maxIPCMaps bounds the peer's allocations a link has open at once;
// a grant that would pass it goes over TCP instead.
const maxIPCMaps = 256

// ipcKey names an opened allocation: its handle and the device it was
// opened on.
type ipcKey struct {
	h   [kernels.IPCHandleBytes]byte
	dev int
}

// ipcMap is a peer's allocation opened here.
type ipcMap struct {
	key  ipcKey
	gpu  *device.GPU
	ptr  kernels.Ptr
	size uint64
	refs int // grants' records and leases using it now
}

// ipcRecords encodes the IPC records of segs, all GPU memory, or reports
// false where one is not GPU memory or cannot be exported.
func ipcRecords(segs []seg) ([]byte, bool) {
	b := make([]byte, len(segs)*IPCRecSize)
	var last *device.CUDABuffer
	var base kernels.Ptr
	var h [kernels.IPCHandleBytes]byte
	for i, s := range segs {
		if s.d == nil || s.d.Dev == nil {
			return nil, false
		}
		if s.d != last {
			lib, dev := s.d.Dev.Lib(), s.d.Dev.Ordinal
			bs, size, err := lib.MemRange(dev, s.d.Ptr)
			if err != nil || s.d.Ptr < bs || uint64(s.d.Ptr-bs)+uint64(s.d.Len) > size {
				return nil, false
			}
			if h, err = lib.IPCHandle(dev, bs); err != nil {
				return nil, false
			}
			last, base = s.d, bs
		}
		r := ipcRec{h: h, off: uint64(s.d.Ptr-base) + uint64(s.off), n: uint64(s.n)}
		r.put(b[i*IPCRecSize:])
	}
	return b, true
}

// openIPC returns the peer's allocation of handle h opened on gpu,
// taking a reference that unrefIPC drops. An allocation is open only
// while a grant uses it (the copies in flight share one open): the peer
// may free its memory once the grant is released, and CUDA leaves the
// exporter's free of an allocation still open elsewhere undefined (and a
// stale mapping would keep a later allocation at its address from
// opening). refused says whether the open itself failed (a handle that
// does not open here) rather than a bound or the link's end.
func (l *link) openIPC(gpu *device.GPU, h [kernels.IPCHandleBytes]byte) (m *ipcMap, refused bool, err error) {
	// One open or close at a time on the link, so that it holds one open
	// of an allocation (its entry in l.ipcs) and closes it once: grants of
	// it opening at once, or one opening while another closes it, take
	// the open that is there. (CUDA counts a second open in the process,
	// and would keep the mapping until a second close.)
	l.ipcMu.Lock()
	defer l.ipcMu.Unlock()
	k := ipcKey{h: h, dev: gpu.Ordinal}
	l.mu.Lock()
	if m := l.ipcs[k]; m != nil {
		m.refs++
		l.mu.Unlock()
		return m, false, nil
	}
	full := len(l.ipcs) >= maxIPCMaps
	l.mu.Unlock()
	if full {
		return nil, false, fmt.Errorf("the link has %d allocations of the peer open", maxIPCMaps)
	}
	lib := gpu.Lib()
	if testHookIPCOpen != nil {
		testHookIPCOpen()
	}
	ptr, err := lib.IPCOpen(gpu.Ordinal, h)
	if err != nil {
		return nil, true, err
	}
	base, size, err := lib.MemRange(gpu.Ordinal, ptr)
	if err == nil && base != ptr {
		err = fmt.Errorf("the opened allocation starts at %#x, its mapping at %#x", base, ptr)
	}
	if err != nil {
		lib.IPCClose(gpu.Ordinal, ptr)
		return nil, true, err
	}
	l.mu.Lock()
	if l.err != nil {
		err := l.err
		l.mu.Unlock()
		lib.IPCClose(gpu.Ordinal, ptr)
		return nil, false, err
	}
	if l.ipcs == nil {
		l.ipcs = map[ipcKey]*ipcMap{}
	}
	m = &ipcMap{key: k, gpu: gpu, ptr: ptr, size: size, refs: 1}
	l.ipcs[k] = m
	l.mu.Unlock()
	return m, false, nil
}

// unrefIPC drops the references openIPC took (ms may hold nils and
// repeats), and closes what nothing uses any more.
func (l *link) unrefIPC(ms []*ipcMap) {
	var idle []*ipcMap
	l.mu.Lock()
	for _, m := range ms {
		if m != nil {
			l.unrefIPCLocked(m, &idle)
		}
	}
	l.mu.Unlock()
	l.closeIPC(idle)
}

// unrefIPCLocked drops a reference to m (under l.mu), adding m to idle
// when it was the last, for closeIPC.
func (l *link) unrefIPCLocked(m *ipcMap, idle *[]*ipcMap) {
	if m.refs--; m.refs == 0 {
		*idle = append(*idle, m)
	}
}

// closeIPC closes the allocations of ms that nothing uses (outside l.mu,
// which it takes). It removes them from l.ipcs only under l.ipcMu, as it
// closes them, so that an open that comes first (see openIPC) takes the
// allocation still open instead of mapping it a second time; one it
// took is left open, one closed already is not closed again.
func (l *link) closeIPC(ms []*ipcMap) {
	if len(ms) == 0 {
		return
	}
	if testHookIPCClose != nil {
		testHookIPCClose()
	}
	l.ipcMu.Lock()
	defer l.ipcMu.Unlock()
	for _, m := range ms {
		l.mu.Lock()
		last := m.refs == 0 && l.ipcs[m.key] == m
		if last {
			delete(l.ipcs, m.key)
		}
		l.mu.Unlock()
		if last {
			// A close that fails leaves the mapping to the process's
			// exit: nothing here can do better, and no transfer waits
			// on it (the grant's release goes all the same).
			m.gpu.Lib().IPCClose(m.gpu.Ordinal, m.ptr)
		}
	}
}

// ipcGranted copies a same-host part's bytes through the IPC grant its
// answer h carries (the records follow h), then releases the grant. A
// handle that does not open here sends the request again over TCP; a
// range outside its allocation breaks the protocol (ErrFrame).
func (c *conn) ipcGranted(h header, p *part) error {
	l := c.l
	if cap(c.desc) < int(h.payload) {
		c.desc = make([]byte, h.payload)
	}
	b := c.desc[:h.payload]
	if err := c.readFull(b); err != nil {
		return err
	}
	release := func() { l.enqueue(c.idx, frame{kind: kRelease, id: h.id}) }
	if p == nil { // given up: the grant goes back unused
		release()
		return nil
	}
	recs, err := decodeIPCGrant(b, int(h.b), p.total, nil)
	if err != nil {
		release()
		return err
	}
	var gpu *device.GPU
	for _, s := range p.local {
		if s.d == nil || s.d.Dev == nil {
			// oneSided asks rReadG and rWriteG only for GPU memory.
			release()
			return fmt.Errorf("%w: an IPC grant for request %d, whose local ranges are host memory", ErrFrame, h.id)
		}
		if gpu == nil {
			gpu = s.d.Dev
		}
	}
	maps := make([]*ipcMap, len(recs))
	for i, r := range recs {
		m, refused, err := l.openIPC(gpu, r.h)
		if err != nil {
			l.unrefIPC(maps)
			release()
			if refused {
				// Later transfers of GPU memory go over TCP at once.
				l.ipcOff.Store(true)
			}
			if l.failed() == nil {
				c.overTCP(p)
			}
			return nil
		}
		maps[i] = m
		if r.off > m.size || r.n > m.size-r.off {
			l.unrefIPC(maps)
			release()
			return fmt.Errorf("%w: an IPC grant of %d bytes at %d of an allocation of %d", ErrFrame, r.n, r.off, m.size)
		}
	}
	// The copy runs in a goroutine of its own, as a host grant's does
	// (granted), so that the reader goes on reading while it lasts.
	idx, write := c.idx, h.sub == rWriteG
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		err := ipcCopy(p, recs, maps, write)
		l.unrefIPC(maps)
		l.enqueue(idx, frame{kind: kRelease, id: h.id})
		if err != nil {
			p.finish(opErr(p.f.op, l.p.name, p.f.label(), ErrInvalid, "copying GPU memory through the peer's IPC grant: %v", err))
			return
		}
		p.finish(nil)
	}()
	return nil
}

// ipcChunk is the most one device copy of ipcCopy moves. Each copy is
// enqueued and then waited for, a fixed cost per call, which chunks of
// process_vm's size (cmaChunk) would pay sixteen times for 64 MiB of
// device memory that copies in tens of microseconds; a cancelled transfer
// waits for at most one chunk's copy (under a millisecond over NVLink,
// some milliseconds over PCIe). A variable so that tests cross chunks
// with small regions.
var ipcChunk = 64 << 20

// ipcCopy copies p's bytes from (write false) or to (write true) the
// peer's ranges recs, opened as maps, a chunk at a time under p's lock,
// while p is active, each with a synchronous copy on the device of its
// local range.
func ipcCopy(p *part, recs []ipcRec, maps []*ipcMap, write bool) error {
	lk := cursor{segs: p.local}
	for i, r := range recs {
		for done := uint64(0); done < r.n; {
			s := lk.next(int(min(r.n-done, uint64(ipcChunk))))
			if s.n == 0 || s.d == nil {
				return fmt.Errorf("the local ranges end before the grant's %d bytes", p.total)
			}
			p.mu.Lock()
			if !p.active {
				p.mu.Unlock()
				return nil
			}
			// The local buffer is read only while p is active: once it
			// has ended, its owner may free it (Deregister returned).
			local := s.d.Ptr + kernels.Ptr(s.off)
			remote := maps[i].ptr + kernels.Ptr(r.off+done)
			dst, src := local, remote
			if write {
				dst, src = remote, local
			}
			err := s.d.Dev.Lib().Memcpy(s.d.Dev.Ordinal, dst, src, uint64(s.n))
			p.mu.Unlock()
			if err != nil {
				return err
			}
			done += uint64(s.n)
		}
	}
	return nil
}

// ipcLeaseAnswered takes the grant of GPU lease ls (its one record, b):
// the region's allocation is opened on the lease's device and the region
// checked against it. A handle that does not open here gives the lease
// back unused (and the link's GPU memory goes over TCP from then on); a
// region outside the allocation breaks the protocol.
func (c *conn) ipcLeaseAnswered(ls *lease, b []byte) error {
	l := c.l
	recs, err := decodeIPCGrant(b, 1, ls.region.Size, nil)
	if err != nil {
		return err
	}
	r := recs[0]
	if testHookLeaseOpen != nil {
		testHookLeaseOpen()
	}
	m, refused, err := l.openIPC(ls.gpu, r.h)
	if err == nil && (r.off > m.size || r.n > m.size-r.off) {
		l.unrefIPC([]*ipcMap{m})
		return fmt.Errorf("%w: a lease of %d bytes at %d of an allocation of %d", ErrFrame, r.n, r.off, m.size)
	}
	l.mu.Lock()
	ls.ready = true // granted: the target holds it until the release
	if err == nil {
		ls.ipc, ls.ipcOff = m, r.off
	} else {
		ls.dead = true
		if refused {
			l.ipcOff.Store(true)
		}
	}
	rel := false
	var doomed []*ipcMap
	if l.err != nil || ls.dead { // ended meanwhile, or never usable: given back
		ls.dead = true
		rel = l.endLeaseLocked(ls, &doomed)
	}
	l.mu.Unlock()
	l.closeIPC(doomed)
	if rel {
		l.releaseLease(ls)
	}
	return nil
}
