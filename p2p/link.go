package p2p

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/inter"
	"github.com/slimego/slimego/internal/raceio"
	"golang.org/x/sys/unix"
)

// transport carries one peer's transfers. A link chooses it at Connect
// and every Future reports its name. The TCP link is the one there is; a
// verbs (RDMA) transport would implement submit by posting work requests
// against the peer's registered memory (its rkey is RemoteRegion.Key)
// and complete parts from its completion queue, with the same part and
// Future bookkeeping, so that cancellation, deregistration and a lost
// peer keep their meaning.
var _ transport = (*link)(nil)

type transport interface {
	// name is what Future.Transport reports.
	name() string
	// submit starts part p (registered in the link's maps already).
	submit(p *part)
	// fail ends every transfer of the transport with err.
	fail(err error)
}

// Peer is the link to one other endpoint. Its methods start transfers and
// return at once; each returns a *Future. They are safe for concurrent use;
// Sends are matched with the peer's Recvs in the order each side called
// them.
type Peer struct {
	e       *Endpoint
	name    string
	ready   chan struct{} // closed when l or err is set
	dialing bool
	cut     bool // the dialing Connect ended by its own context; set with err (dropPeerCut)
	l       *link
	err     error
	imu     sync.Mutex
	in      info
}

func newPeer(e *Endpoint, name string) *Peer {
	return &Peer{e: e, name: name, ready: make(chan struct{})}
}

func (p *Peer) setInfo(in info) { p.imu.Lock(); p.in = in; p.imu.Unlock() }
func (p *Peer) getInfo() info   { p.imu.Lock(); defer p.imu.Unlock(); return p.in }

// Name is the peer's name.
func (p *Peer) Name() string { return p.name }

// made reports whether p came from Connect or ConnectInfo: the calls of a
// zero or nil Peer fail with ErrInvalid (errZeroPeer), not a panic.
func (p *Peer) made() bool { return p != nil && p.l != nil && p.e != nil }

// errZeroPeer is the error of a call on a Peer that made says is not one.
func errZeroPeer(op string) error {
	return opErr(op, "", "", ErrInvalid, "a Peer not made by Connect or ConnectInfo")
}

// Transport names the link's transport for host memory: "cma" when the
// peer is on this host and may be copied from with process_vm_readv/writev,
// else "tcp" (sends, receives, immediates and GPU memory always go over
// TCP; each Future says what carried it).
func (p *Peer) Transport() string {
	if !p.made() {
		return ""
	}
	return p.l.name()
}

// Remote returns the peer's region named name as its Info listed it at
// the latest Connect (ok false when it did not). Regions the peer
// registered later are found once it has published again (Publish) and
// this side has called Connect again, which takes the new Info.
func (p *Peer) Remote(name string) (RemoteRegion, bool) {
	if !p.made() {
		return RemoteRegion{}, false
	}
	for _, r := range p.getInfo().regions {
		if r.Name == name {
			return r, true
		}
	}
	return RemoteRegion{}, false
}

// Op is one range of a batched Read or Write: Len bytes at LocalOff of
// Local and at RemoteOff of Remote. Len is 1 or more, and both ranges lie
// within their regions (the remote one within the Size its RemoteRegion
// gives): a call with an op that does not fails at once with ErrInvalid,
// and nothing is sent. The peer checks every range again against the
// region it holds (ErrRefused, on both sides).
type Op struct {
	Local     *Region
	LocalOff  int
	Remote    RemoteRegion
	RemoteOff int
	Len       int
}

// part is one request of a call: its bytes move on one connection (ch),
// its request goes on that one or, for a stripe of a read asked with the
// others, on the first stripe's (reqCh). Its memory is touched
// only by a goroutine that holds mu and finds it active, so that once
// finish returns nothing touches it again.
type part struct {
	l    *link
	f    *Future
	kind uint8 // rRead, rWrite, rImm, rSend; rCTS for a receive
	sub  uint8 // the request's kind on the wire (rReadV, rWriteV on the same host)
	id   uint64
	ch   int // the connection that carries the part's bytes
	// reqCh is the connection its request goes on: ch, or for a stripe
	// of a read whose stripes are asked together (link.requestAll), the
	// first stripe's. A cancel follows the request on it, so that it never
	// overtakes it.
	reqCh  int
	mu     sync.Mutex
	active bool
	local  []seg  // this side's ranges, in order
	descs  []desc // the whole batch's
	lo     uint64 // where the part's stripe starts in the batch's bytes
	total  uint64 // the stripe's bytes
	imm    uint32
	// withImm: a write (sub rWrite) whose request carries imm, for the
	// target to queue once the bytes are in place (rWriteImm on the wire).
	withImm bool
	regs    []*Region // this side's regions (Deregister fails the part)
	cts     bool      // a receive: its clear-to-send went out; a send: the receiver's came (under l.mu)
	// copying: a process_vm copy of p's is in the kernel, or about to
	// take mu for one (vmCopy); ending: p is being finished. A copy can be
	// held up without bound by the peer's memory (pages a userfaultfd
	// holds back, a file on a hung file system), and it holds mu: finish
	// then leaves the part to a goroutine that waits for the copy, rather
	// than wait itself. Each side stores its flag before it loads the
	// other's, so that a copy that finish did not see starts no more.
	// copying counts the copies (a peer may answer a request twice: two
	// goroutines copy the part), so that one that finds p ending does not
	// clear the mark of another still in the kernel.
	copying atomic.Int32
	ending  atomic.Bool
	handed  atomic.Bool // finish has left p to a goroutine (finishNow)
	// failed is the error of the first finish that came with one: a
	// finish whose copy is in the kernel ends p later (finishNow), and a
	// success that the copy reports meanwhile must not win over it.
	failed atomic.Pointer[error]
}

// finish ends p with err (nil: success) unless it has ended already. It
// reports true when it could not end p at once because a same-host copy
// of p's is in the kernel: a goroutine of its own ends p when the copy
// returns (Future.end bounds the wait for it).
func (p *part) finish(err error) (later bool) {
	if err != nil {
		e := err // only a failure's error goes to the heap: finish(nil) allocates nothing
		p.failed.CompareAndSwap(nil, &e)
	}
	p.ending.Store(true)
	if p.copying.Load() > 0 {
		if !p.handed.Swap(true) { // one goroutine waits for the copy, however often Wait is retried
			go p.finishNow(err)
		}
		return true
	}
	p.finishNow(err)
	return false
}

// finishNow is finish, waiting for p's lock.
func (p *part) finishNow(err error) {
	if e := p.failed.Load(); err == nil && e != nil {
		err = *e
	}
	p.mu.Lock()
	if !p.active {
		p.mu.Unlock()
		return
	}
	p.active = false
	sub := p.sub
	p.mu.Unlock()
	if err != nil && sub == rRead {
		// The target may still be sending the bytes: tell it to stop
		// (it ignores an id it is not serving).
		p.l.enqueue(p.reqCh, frame{kind: kCancel, id: p.id})
	}
	for _, r := range p.regs {
		r.mu.Lock()
		delete(r.users, p)
		r.mu.Unlock()
	}
	p.l.forget(p)
	if f := p.f; err == nil && p.kind == rWrite && f.then != nil && f.writesLeft.Add(-1) == 0 {
		p.l.submit(f.then)
	}
	p.f.partDone(err)
}

// link is one peer's transport: Channels TCP connections, each with a
// reader and a writer goroutine (and, on the same host, the grants of
// cma_linux.go). Either end may start requests on any
// connection; a request's bytes, and an answer's, travel on one
// connection, whole (a read's answer on the connection its request names,
// which need not be the one that carried it: requestAll).
type link struct {
	e     *Endpoint
	p     *Peer
	conns []*conn
	hb    time.Duration

	mu     sync.Mutex
	err    error
	nextID uint64
	parts  map[uint64]*part // this side's reads, writes and immediates
	sends  map[uint64]*part // this side's sends, by sequence
	recvs  map[uint64]*part // this side's posted receives, by sequence
	rts    map[uint64]uint64
	// rtsRefused are the peer's sends refused because rts was full
	// (at most maxPendingRTS of them): a receive of one of their
	// sequences fails at once.
	rtsRefused map[uint64]struct{}
	sendSeq    uint64
	recvSeq    uint64
	rr         int                  // the next connection for a small request
	grants     map[uint64][]*Region // same host: ranges lent to the peer, by its request id
	// leased are the grants that are leases (lease_linux.go), by request
	// id, with the connection each was granted on: Deregister revokes them.
	leased map[uint64]int
	// leases are the peer's regions this side asked leases of, by region
	// id, and leaseIDs the live ones by their request's id.
	leases map[uint64]*lease
	// gpuLeases: the same for batches of GPU memory (ipc.go).
	gpuLeases map[uint64]*lease
	leaseIDs  map[uint64]*lease
	// goneLeases and goneGPULeases are the region ids, oldest first, of
	// the entries of leases and gpuLeases whose regions are gone for good
	// (revoked: deregistered; or refused as no such region): they do not
	// count against maxLeases, and past maxLeases of them the oldest
	// released ones are forgotten (lease_linux.go, gone).
	goneLeases, goneGPULeases []uint64
	// grantRefs counts the region references of all grants, one per run
	// of a grant's ranges in one region (at most maxGrantRefs).
	grantRefs int
	// grantCopies counts this side's copies through the peer's grants
	// that have not yet queued their release (Close waits for them:
	// endGrantCopies).
	grantCopies atomic.Int32
	serving     map[uint64]*atomic.Bool // reads being answered, by the peer's request id: set to stop
	cma         atomic.Bool             // same host: copy with process_vm_readv/writev (cma_linux.go)
	pid         int                     // the peer's process, when cma
	// waitReads: a small transfer's Wait may read its answer itself
	// (own_linux.go): the peer is not in this process.
	waitReads bool
	// pidfd pins the peer's process while the link lives (-1: the peer
	// is this process, or not on this host): Shared memory is taken from
	// it (mapPeer).
	pidfd int
	self  bool // the peer is this process (cma)
	// ipcOff: GPU memory goes over TCP, not through CUDA IPC (ipc.go):
	// the peer is this process, which cannot open its own handles, or a
	// handle it granted did not open here.
	ipcOff atomic.Bool
	// maps are the peer's Shared memories mapped here, by their ids
	// (shared_linux.go); mapTick orders their use.
	maps    map[uint64]*peerMap
	mapTick uint64
	// ipcs are the peer's GPU allocations open here (ipc.go), while
	// grants use them; ipcMu orders their opens and closes (taken before
	// mu).
	ipcs  map[ipcKey]*ipcMap
	ipcMu sync.Mutex
	// peerPid is the pid the peer gave (its hello, or its Info when this
	// side dialed); grants go only to a peer whose process it is
	// (grantable, once per link).
	peerPid   uint32
	grantOnce sync.Once
	grantOK   bool
	// grantPidfd pins the process granted memory (grantable; -1: none),
	// so that the link's end releases what it was lent as soon as that
	// process has exited (fail).
	grantPidfd int
	stop       chan struct{}
	wg         sync.WaitGroup
	// leasesGone: this side's endpoint is closing and gave its leases
	// back (giveBackLeases); no lease is asked any more.
	leasesGone bool
	// closedConns counts the connections whose peer closed them
	// (connEnded): the link fails once all have, or closeGrace after the
	// first.
	closedConns int
	// imm queues the immediates the peer delivers over this link.
	imm *immQueue
	// over: a connection's queued answers passed maxQueued, and the link
	// fails (enqueue starts that once).
	over atomic.Bool
}

// closeGrace is how long a link whose peer closed one of its connections
// waits for the others' ends before it fails: the peer closes them all at
// once (its Close, its exit), and a frame it sent just before on another
// connection (a release) is read before that connection's end, rather
// than lost with the link. A peer that dies ends them all at once too.
const closeGrace = 100 * time.Millisecond

type conn struct {
	l   *link
	idx int
	c   *net.TCPConn
	rd  inter.Reader

	qmu  sync.Mutex
	q    []job
	dead bool // the writer has ended: jobs are dropped
	// busy: a goroutine is writing to the socket (the writer with a job,
	// or another with a direct frame); under qmu.
	busy bool
	// wdl: the socket has a write deadline (set by writeBufs for a blocking
	// write); only the goroutine that holds busy reads or sets it.
	wdl  bool
	wake chan struct{}
	// answers counts the jobs in q that the peer's frames caused
	// (isAnswer): maxQueued bounds them, whatever frame caused them
	// (enqueue).
	answers int

	whdr    [HeaderSize]byte
	lhdr    [HeaderSize]byte // a lead frame's header (sendChunks)
	lead    [][]byte         // the pieces of a lead frame (sendChunks)
	pieces  [][]byte         // a data frame's pieces (sendChunks)
	rhdr    [HeaderSize]byte
	wdesc   []byte // the writer's encoded descriptors
	desc    []byte // the reader's payloads
	descs   []desc
	segs    []seg
	regs    []*Region
	wstage  []byte   // GPU bytes staged for the writer
	rstage  []byte   // and by the reader
	vbufs   [][]byte // the reader's host buffers of one chunk (recvChunks)
	scratch []byte
	bufs    net.Buffers
	rc      syscall.RawConn // for direct's non-blocking writes
	dbuf    []byte          // direct's frames, built by whoever holds busy
	// writeFn is writeOnce as a func value made once (a closure made per
	// write would be allocated per write); wb, wn and werr are its
	// argument and results, used by whoever holds busy.
	writeFn func(fd uintptr) bool
	wb      []byte
	wn      int
	werr    error
	// ahead: the last frame read had a small payload (or none), so the
	// next header is read with what follows it (inter.Reader.ReadAhead);
	// after a large one it is read alone, so that a large payload is read
	// whole into its buffer (with its low-water mark).
	ahead bool
	// waker is what a Wait for a Future whose first part goes on this
	// connection parks on (nil without one: the Future's channel).
	waker *waker
	// sock: who reads the socket, the reader goroutine or a Wait
	// (own_linux.go).
	sock
}

// job is what a connection's writer writes, whole, before the next.
type job interface{ write(c *conn) error }

// newLink makes the link of tcs to p, whose heartbeat deadline is hb (the
// shorter of the two ends').
func newLink(e *Endpoint, p *Peer, tcs []*net.TCPConn, hb time.Duration) *link {
	l := &link{e: e, p: p, hb: hb, parts: map[uint64]*part{}, sends: map[uint64]*part{},
		recvs: map[uint64]*part{}, rts: map[uint64]uint64{}, rtsRefused: map[uint64]struct{}{}, grants: map[uint64][]*Region{}, leased: map[uint64]int{}, serving: map[uint64]*atomic.Bool{}, stop: make(chan struct{}), pidfd: -1, grantPidfd: -1, imm: &immQueue{peer: p.name}}
	for i, tc := range tcs {
		tc.SetNoDelay(true)
		tc.SetWriteBuffer(inter.DefaultSockBuf)
		c := &conn{l: l, idx: i, c: tc, rd: inter.NewReader(tc, inter.DefaultLowat), wake: make(chan struct{}, 1), ahead: true}
		c.rc, _ = tc.SyscallConn()
		c.writeFn = c.writeOnce
		c.turnFn = c.takeTurn
		c.spin = inter.DefaultPollMax
		c.waker = newWaker()
		l.conns = append(l.conns, c)
	}
	return l
}

func (l *link) name() string {
	if l.cma.Load() {
		return "cma"
	}
	return "tcp"
}

func (l *link) start() {
	for _, c := range l.conns {
		l.wg.Add(3)
		go func() { defer l.wg.Done(); c.reader() }()
		go func() { defer l.wg.Done(); c.writer() }()
		go func() { defer l.wg.Done(); c.pinger() }()
	}
	l.e.wg.Add(1)
	go func() {
		defer l.e.wg.Done()
		<-l.stop
		l.wg.Wait()
		// Nothing copies any more: the peer's memories are unmapped.
		l.mu.Lock()
		doomed := l.endLeases()
		l.dropMaps()
		if l.pidfd >= 0 {
			unix.Close(l.pidfd)
			l.pidfd = -1
		}
		if l.grantPidfd >= 0 {
			unix.Close(l.grantPidfd)
			l.grantPidfd = -1
		}
		l.mu.Unlock()
		l.closeIPC(doomed)
		for _, c := range l.conns {
			if c.waker != nil {
				c.endWaker()
			}
		}
	}()
}

// track counts a goroutine that copies for the link (a copy through a
// lease) in l.wg, so that the link's end, and so Close, waits for it as
// for its own goroutines: it unmaps the peer's memories and closes the
// peer's pidfd only once nothing copies. It reports false, counting
// nothing, once the link has failed (its end may be waiting already).
func (l *link) track() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return false
	}
	// l.wg's Wait starts after fail, which sets l.err under l.mu: this
	// Add comes before it.
	l.wg.Add(1)
	return true
}

// fail ends the link: its connections close, and every transfer on it
// fails with err (the first cause wins).
func (l *link) fail(err error) {
	l.mu.Lock()
	if l.err != nil {
		l.mu.Unlock()
		return
	}
	l.err = err
	close(l.stop)
	e := l.e
	var all []*part
	for _, m := range []map[uint64]*part{l.parts, l.sends, l.recvs} {
		for _, p := range m {
			all = append(all, p)
		}
	}
	var lent []*Region
	for id, regs := range l.grants {
		lent = append(lent, regs...)
		delete(l.grants, id)
	}
	l.grantRefs = 0
	clear(l.leased)
	exited := -1
	if len(lent) > 0 && l.grantPidfd >= 0 {
		exited, _ = unix.FcntlInt(uintptr(l.grantPidfd), unix.F_DUPFD_CLOEXEC, 0)
	}
	l.mu.Unlock()
	// The peer may be linked again by a later Connect. (e.mu is taken
	// after l.mu is let go: enableCMA holds e.mu while it takes l.mu.)
	e.mu.Lock()
	if e.peers[l.p.name] == l.p {
		delete(e.peers, l.p.name)
	}
	e.mu.Unlock()
	if len(lent) > 0 {
		// The peer may still be copying through a grant or lease it has
		// not released: it stops when it notices the link is gone (its
		// reader when the connection closes, or its pings, every
		// heartbeat/4, within half a heartbeat), and then within a
		// chunk. Until its process has exited, or a heartbeat has
		// passed, the regions count as in use (Deregister and Close
		// wait).
		go func() {
			waitExit(exited, l.hb)
			l.e.release(l.p, lent)
		}()
	}
	for _, c := range l.conns {
		c.shut()
	}
	for _, p := range all {
		p.finish(err)
	}
	e.immsEnded(l.imm, err) // a Peer.Imm of this link fails now
}

func (l *link) failed() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

func (l *link) forget(p *part) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch p.kind {
	case rSend:
		if l.sends[p.id] == p {
			delete(l.sends, p.id)
		}
	case rCTS:
		if l.recvs[p.id] == p {
			delete(l.recvs, p.id)
		}
	default:
		if l.parts[p.id] == p {
			delete(l.parts, p.id)
		}
	}
}

// enqueue hands j to connection ch's writer; a frame without payload is
// written at once by the calling goroutine instead when the writer is
// idle (direct).
func (l *link) enqueue(ch int, j job) {
	c := l.conns[ch]
	answer := isAnswer(j)
	if f, ok := j.(frame); ok {
		if c.direct(answer, func(b []byte) []byte { return appendHeader(b, header(f)) }) {
			return
		}
	}
	fenceRelease()
	c.qmu.Lock()
	if c.dead {
		c.qmu.Unlock()
		dropJob(l, j)
		return
	}
	if answer && c.answers >= maxQueued {
		queued := c.answers
		c.qmu.Unlock()
		dropJob(l, j)
		// The caller may hold the link's lock (rtsArrived): fail from a
		// goroutine of its own, once.
		if l.over.CompareAndSwap(false, true) {
			go l.fail(c.classify(fmt.Errorf("%w: %d answers wait to be sent on connection %d: the peer sends frames and does not read what they cause", ErrFrame, queued, c.idx), "receiving"))
		}
		return
	}
	c.q = append(c.q, j)
	if answer {
		c.answers++
	}
	c.qmu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// isAnswer reports whether j was caused by the peer's frames rather than
// started by this side: a request, a send and its announcement, a cancel
// of a request given up, a revoke of a lease (Deregister), a ping.
func isAnswer(j job) bool {
	switch j := j.(type) {
	case reqJob, sendJob:
		return false
	case frame:
		return !(j.kind == kReq && j.sub == rRTS || j.kind == kCancel || j.kind == kRevoke || j.kind == kPing)
	case rawJob:
		return j.answer
	}
	return true
}

// directMax bounds the frames (headers and payload together) that a
// goroutine other than the connection's writer writes itself (direct):
// requests, small writes' bytes, answers and small reads' bytes. Each
// hand-off to the writer goroutine costs a wake-up, which is most of a
// small operation's time.
const directMax = 16 << 10

// direct writes the frames fill appends to b (at most directMax bytes,
// or togetherMax for a read's requests asked together; fill may append
// nothing) from the calling goroutine, when the
// connection's writer has nothing queued and no other goroutine is
// writing: one non-blocking write. What the socket does not take at once
// is queued first for the writer, copied, so that fill's memory is not
// touched after direct returns; the write never waits for the peer, so
// that a reader goroutine may call it (two readers blocked writing to
// each other would stall until the heartbeat). It reports false, having
// written nothing, when the writer is busy: the caller queues the job.
// answer says whether the frames were caused by the peer's (maxQueued
// counts them when they wait in the queue). A failed write fails the
// link (in a goroutine of its own: the caller may hold the link's lock).
func (c *conn) direct(answer bool, fill func(b []byte) []byte) bool {
	if c.rc == nil {
		return false
	}
	fenceRelease()
	c.qmu.Lock()
	if c.dead || c.busy || len(c.q) > 0 {
		c.qmu.Unlock()
		return false
	}
	c.busy = true
	c.qmu.Unlock()
	b := fill(c.dbuf[:0])
	if cap(b) <= 4*directMax {
		c.dbuf = b[:0]
	}
	n, err := 0, error(nil)
	if len(b) > 0 {
		n, err = c.writeNow(b)
	}
	c.qmu.Lock()
	if err == nil && n < len(b) {
		c.q = append(c.q, nil)
		copy(c.q[1:], c.q)
		c.q[0] = rawJob{b: append([]byte(nil), b[n:]...), answer: answer}
		if answer {
			c.answers++
		}
	}
	c.busy = false
	more := len(c.q) > 0
	c.qmu.Unlock()
	if more {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
	if err != nil {
		go c.l.fail(c.classify(err, "sending"))
	}
	return true
}

// writeNow is one non-blocking write of b: it returns what the socket
// took (0 when its buffer is full).
func (c *conn) writeNow(b []byte) (int, error) {
	if c.wdl {
		// A deadline an earlier frame set (send) may have passed long
		// ago, on an idle link; the runtime would fail this write for
		// it before it is made. A write that cannot wait needs none.
		c.c.SetWriteDeadline(time.Time{})
		c.wdl = false
	}
	raceio.Release()
	c.wb = b
	err := c.rc.Write(c.writeFn)
	c.wb = nil // keep no buffer alive
	n, werr := c.wn, c.werr
	c.wn, c.werr = 0, nil
	if err != nil {
		return 0, err
	}
	return n, werr
}

// writeOnce is writeNow's one write of c.wb, whose results it leaves in
// c.wn and c.werr; it never waits (EAGAIN: nothing taken).
func (c *conn) writeOnce(fd uintptr) bool {
	for {
		m, e := unix.Write(int(fd), c.wb)
		switch e {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			m, e = 0, nil
		}
		c.wn, c.werr = max(m, 0), e
		return true
	}
}

// rawJob is the rest of a direct write that the socket did not take.
type rawJob struct {
	b      []byte
	answer bool
}

func (j rawJob) write(c *conn) error {
	c.c.SetWriteDeadline(time.Now().Add(c.l.hb))
	c.wdl = true
	raceio.Release()
	_, err := c.c.Write(j.b)
	return err
}

// appendHeader appends h, encoded, to b.
func appendHeader(b []byte, h header) []byte {
	b = append(b, make([]byte, HeaderSize)...)
	h.put(b[len(b)-HeaderSize:])
	return b
}

// dropJob releases what a job that will never be written holds.
func dropJob(l *link, j job) {
	if s, ok := j.(serveRead); ok {
		l.e.release(l.p, s.regs)
		l.mu.Lock()
		delete(l.serving, s.id)
		l.mu.Unlock()
	}
}

func (c *conn) writer() {
	defer func() {
		c.qmu.Lock()
		c.dead = true
		q := c.q
		c.q, c.answers = nil, 0
		c.qmu.Unlock()
		for _, j := range q {
			dropJob(c.l, j)
		}
	}()
	for {
		c.qmu.Lock()
		var j job
		if len(c.q) > 0 && !c.busy {
			j = c.q[0]
			c.q[0] = nil
			c.q = c.q[1:]
			if isAnswer(j) {
				c.answers--
			}
			c.busy = true
		}
		c.qmu.Unlock()
		if j == nil {
			select {
			case <-c.wake:
				continue
			case <-c.l.stop:
				return
			}
		}
		err := j.write(c)
		c.qmu.Lock()
		c.busy = false
		c.qmu.Unlock()
		if err != nil {
			c.l.fail(c.classify(err, "sending"))
			return
		}
	}
}

// pinger queues a ping every Heartbeat/4 while the writer has nothing
// queued, so that a live peer is never silent for a heartbeat.
func (c *conn) pinger() {
	t := time.NewTicker(c.l.hb / 4)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			c.qmu.Lock()
			idle := len(c.q) == 0
			c.qmu.Unlock()
			if idle {
				c.l.enqueue(c.idx, frame{kind: kPing})
			}
		case <-c.l.stop:
			return
		}
	}
}

// classify maps a socket error to the package's errors.
func (c *conn) classify(err error, what string) error {
	peer := c.l.p.name
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return opErr(what, peer, "", ErrTimeout, "the link was silent for the heartbeat deadline (%v)", c.l.hb)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, net.ErrClosed):
		return opErr(what, peer, "", ErrPeerLost, "connection %d closed", c.idx)
	case errors.Is(err, ErrFrame):
		return opErr(what, peer, "", ErrPeerLost, "connection %d: %v", c.idx, err)
	}
	return opErr(what, peer, "", ErrPeerLost, "connection %d: %v", c.idx, err)
}

// send writes the header h and the payload pieces in one vectored write,
// within the heartbeat deadline.
func (c *conn) send(h header, pieces ...[]byte) error {
	return c.sendAfter(nil, h, pieces...)
}

// sendAfter is send with lead (the pieces of whole frames, or nil) written
// first, in the same vectored write.
func (c *conn) sendAfter(lead [][]byte, h header, pieces ...[]byte) error {
	h.put(c.whdr[:])
	c.bufs = append(c.bufs[:0], lead...)
	c.bufs = append(c.bufs, c.whdr[:])
	for _, p := range pieces {
		if len(p) > 0 {
			c.bufs = append(c.bufs, p)
		}
	}
	return c.writeBufs()
}

// leadOf is bufs as a lead for sendChunks, in the connection's own slice
// (the writer's: one at a time).
func (c *conn) leadOf(bufs ...[]byte) [][]byte {
	c.lead = append(c.lead[:0], bufs...)
	return c.lead
}

// sendRaw writes bufs, the pieces of whole frames, in one vectored write,
// within the heartbeat deadline.
func (c *conn) sendRaw(bufs [][]byte) error {
	c.bufs = append(c.bufs[:0], bufs...)
	return c.writeBufs()
}

// writeBufs writes c.bufs in one vectored write, within the heartbeat
// deadline, and empties it. The write consumes a copy of the slice, so
// that c.bufs keeps its array for the next frame; it is cleared, so that
// it holds no memory of the caller's after a write that failed part-way.
func (c *conn) writeBufs() error {
	c.c.SetWriteDeadline(time.Now().Add(c.l.hb))
	c.wdl = true
	raceio.Release()
	b := c.bufs
	_, err := b.WriteTo(c.c)
	clear(c.bufs)
	c.bufs = c.bufs[:0]
	return err
}

// frame is a job of one frame without payload.
type frame header

func (f frame) write(c *conn) error { return c.send(header(f)) }

// seg is a range of memory: host bytes, or n bytes at off of a GPU
// buffer, which crosses the wire staged through host memory a chunk at a
// time.
type seg struct {
	b      []byte
	d      *device.CUDABuffer
	off, n int
	sh     *Shared // b lies in this Shared memory (nil: plain memory)
}

func host(b []byte) seg { return seg{b: b, n: len(b)} }

// sub is the n bytes at lo of s.
func (s seg) sub(lo, n int) seg {
	if s.d == nil {
		return seg{b: s.b[lo : lo+n], n: n, sh: s.sh}
	}
	return seg{d: s.d, off: s.off + lo, n: n}
}

// toHost copies s into dst (len s.n) or returns its host bytes.
func (s seg) toHost(dst []byte) ([]byte, error) {
	if s.d == nil {
		return s.b, nil
	}
	v, err := s.d.Slice(s.off, s.n)
	if err == nil {
		err = v.CopyToHost(dst[:s.n])
	}
	return dst[:s.n], err
}

// fromHost copies src (len s.n) into s, when s is GPU memory.
func (s seg) fromHost(src []byte) error {
	v, err := s.d.Slice(s.off, s.n)
	if err == nil {
		err = v.CopyFromHost(src[:s.n])
	}
	return err
}

// cursor walks a list of ranges.
type cursor struct {
	segs []seg
	i, o int
}

// next returns up to n bytes of the current range and advances past them.
func (k *cursor) next(n int) seg {
	for k.i < len(k.segs) && k.o == k.segs[k.i].n {
		k.i, k.o = k.i+1, 0
	}
	if k.i == len(k.segs) {
		return seg{}
	}
	s := k.segs[k.i]
	m := min(n, s.n-k.o)
	k.o += m
	return s.sub(k.o-m, m)
}

// appendPiece appends b to the pieces of a vectored write or read, as
// part of the last piece when b's memory follows it in the same array (a
// batch's pages that lie back to back): the kernel's work per piece is
// paid once for the run.
func appendPiece(pieces [][]byte, b []byte) [][]byte {
	if k := len(pieces) - 1; k >= 0 && len(b) > 0 {
		if last := pieces[k]; len(last) > 0 && cap(last)-len(last) >= len(b) &&
			unsafe.SliceData(b) == unsafe.SliceData(last[len(last):cap(last)]) {
			pieces[k] = last[:len(last)+len(b)]
			return pieces
		}
	}
	return append(pieces, b)
}

// sendChunks writes total bytes of segs as data frames of up to ChunkMax,
// each under lock (nil: none), checking ok before each; when ok says
// stop, it writes an end frame for id with the status it gives instead of
// the rest. The frames lead (nil: none) go first, in the first frame's
// write (the peer wakes once for both), or alone when total is 0. It
// returns the status of the end frame it sent (stOK: none).
func (c *conn) sendChunks(lead [][]byte, id uint64, segs []seg, total uint64, lock *sync.Mutex, ok func() uint8) (uint8, error) {
	k := cursor{segs: segs}
	if total == 0 && len(lead) > 0 {
		return stOK, c.sendRaw(lead)
	}
	for sent := uint64(0); sent < total; {
		n := int(min(total-sent, ChunkMax))
		if lock != nil {
			lock.Lock()
		}
		if st := ok(); st != stOK {
			if lock != nil {
				lock.Unlock()
			}
			return st, c.sendAfter(lead, header{kind: kEnd, id: id, status: st})
		}
		pieces := c.pieces[:0]
		var err error
		for got := 0; got < n && err == nil; {
			s := k.next(n - got)
			b := s.b
			if s.d != nil {
				if c.wstage == nil {
					c.wstage = make([]byte, ChunkMax)
				}
				b, err = s.toHost(c.wstage[got:])
			}
			pieces = appendPiece(pieces, b)
			got += s.n
		}
		if err != nil { // GPU memory that cannot be read: the transfer ends here
			if lock != nil {
				lock.Unlock()
			}
			clear(pieces)
			return stDevice, c.sendAfter(lead, header{kind: kEnd, id: id, status: stDevice})
		}
		err = c.sendAfter(lead, header{kind: kData, id: id, payload: uint32(n)}, pieces...)
		lead = nil
		c.pieces = pieces[:0]
		clear(pieces) // keep no memory alive
		if lock != nil {
			lock.Unlock()
		}
		if err != nil {
			return stOK, err
		}
		sent += uint64(n)
	}
	return stOK, nil
}

// sent ends p when its bytes stopped because its GPU memory could not be
// read (the peer expects no answer then).
func (p *part) sent(st uint8, err error) error {
	if st == stDevice {
		p.finish(opErr(p.f.op, p.l.p.name, "", ErrInvalid, "reading this side's GPU memory failed"))
	}
	return err
}

// reqJob writes a read or write request, and a write's bytes.
type reqJob struct{ p *part }

// request sends p's request, directly when it is small (with a write's
// bytes: a small write is its request and one data frame), else through
// the connection's writer.
func (l *link) request(p *part) {
	c := l.conns[p.reqCh]
	size := HeaderSize + int(p.reqHeader().payload)
	if p.sub == rWrite {
		size += HeaderSize + int(p.total)
		for _, s := range p.local {
			if s.d != nil {
				size = directMax + 1 // GPU memory is staged by the writer
			}
		}
	}
	if size <= directMax && c.direct(false, func(b []byte) []byte { return p.appendRequest(b) }) {
		return
	}
	l.enqueue(p.reqCh, reqJob{p: p})
}

// requestAll sends the requests of parts, the stripes of one read, all on
// the first one's connection (reqCh), each naming the connection its
// answer goes on (ch): one write, and one wake-up of the target's reader,
// which hands each stripe to its connection's writer. Asked one per
// connection, the stripes would cost one write each, made one after the
// other, and on a loopback or veth link each write runs the peer's
// receive path before it returns: the last stripe would start that much
// later. The requests are written directly when the connection's writer
// is idle, else queued for it.
func (l *link) requestAll(parts []*part) {
	c := l.conns[parts[0].reqCh]
	if c.direct(false, func(b []byte) []byte {
		for _, p := range parts {
			b = p.appendRequest(b)
		}
		return b
	}) {
		return
	}
	for _, p := range parts {
		l.enqueue(c.idx, reqJob{p: p})
	}
}

// together reports whether the requests of parts go together on one
// connection (requestAll): the stripes of a read over TCP, whose requests
// fit a direct write's bound.
func together(parts []*part) bool {
	if len(parts) < 2 {
		return false
	}
	size := 0
	for _, p := range parts {
		if p.sub != rRead {
			return false
		}
		size += HeaderSize + int(p.reqHeader().payload)
	}
	return size <= togetherMax
}

// togetherMax bounds the requests that requestAll writes together: what
// direct may copy when the socket does not take them at once.
const togetherMax = 4 * directMax

// reqHeader is the header of p's read or write request: its payload is
// where the stripe starts and the batch's descriptors, and, for a write
// that carries its immediate (rWriteImm), the immediate.
func (p *part) reqHeader() header {
	size, sub := stripeSize+len(p.descs)*DescSize, p.sub
	if p.withImm {
		size, sub = size+immSize, rWriteImm
	}
	h := header{kind: kReq, sub: sub, id: p.id, a: p.total, b: uint32(len(p.descs)), payload: uint32(size)}
	if sub == rRead {
		h.ch = uint16(p.ch)
	}
	return h
}

// appendRequest appends p's request to b, and a write's bytes as one data
// frame (its ranges are host memory), unless p has ended.
func (p *part) appendRequest(b []byte) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.active {
		return b
	}
	if p.kind == rImm {
		return appendHeader(b, header{kind: kReq, sub: rImm, id: p.id, a: uint64(p.imm)})
	}
	b = appendHeader(b, p.reqHeader())
	b = binary.LittleEndian.AppendUint64(b, p.lo)
	for i := range p.descs {
		b = append(b, make([]byte, DescSize)...)
		p.descs[i].put(b[len(b)-DescSize:])
	}
	if p.withImm {
		b = binary.LittleEndian.AppendUint64(b, uint64(p.imm))
	}
	if p.sub == rWrite {
		b = appendHeader(b, header{kind: kData, id: p.id, payload: uint32(p.total)})
		for _, s := range p.local {
			b = append(b, s.b...)
		}
	}
	return b
}

func (j reqJob) write(c *conn) error {
	p := j.p
	p.mu.Lock()
	if !p.active { // cancelled before it was sent: the peer never hears of it
		p.mu.Unlock()
		return nil
	}
	h := p.reqHeader()
	size := int(h.payload)
	if len(c.wdesc) < size {
		c.wdesc = make([]byte, size)
	}
	binary.LittleEndian.PutUint64(c.wdesc, p.lo)
	for i := range p.descs {
		p.descs[i].put(c.wdesc[stripeSize+i*DescSize:])
	}
	if p.withImm {
		binary.LittleEndian.PutUint64(c.wdesc[size-immSize:], uint64(p.imm))
	}
	// The sub-kind as sent: the reader may switch the part to TCP
	// (stNotHost) as soon as the request is out.
	sub := p.sub
	if p.kind == rImm {
		h = header{kind: kReq, sub: rImm, id: p.id, a: uint64(p.imm)}
	}
	if sub != rWrite {
		err := c.send(h, c.wdesc[:h.payload])
		p.mu.Unlock()
		return err
	}
	// A write's request goes with its first data frame, in one write: the
	// target wakes once for both.
	p.mu.Unlock()
	h.put(c.lhdr[:])
	return p.sent(c.sendChunks(c.leadOf(c.lhdr[:], c.wdesc[:h.payload]), p.id, p.local, p.total, &p.mu, func() uint8 {
		if !p.active {
			return stCancelled
		}
		return stOK
	}))
}

// sendJob writes a send's bytes once the receiver is ready.
type sendJob struct{ p *part }

func (j sendJob) write(c *conn) error {
	p := j.p
	h := header{kind: kReq, sub: rSend, id: p.id, a: p.total}
	h.put(c.lhdr[:])
	return p.sent(c.sendChunks(c.leadOf(c.lhdr[:]), p.id, p.local, p.total, &p.mu, func() uint8 {
		if !p.active {
			return stCancelled
		}
		return stOK
	}))
}

// abandonedSend answers a clear-to-send whose send was cancelled: the
// receiver learns at once.
func abandonedSend(id uint64) frame {
	return frame{kind: kReq, sub: rSend, id: id, status: stCancelled}
}

// serveRead answers a read request this side accepted: its bytes, chunk
// by chunk, stopping at the first chunk after a region was deregistered.
type serveRead struct {
	id    uint64
	total uint64
	segs  []seg
	regs  []*Region
	stop  *atomic.Bool // the initiator gave the read up (kCancel)
}

func (j serveRead) write(c *conn) error {
	defer c.l.e.release(c.l.p, j.regs)
	defer func() {
		c.l.mu.Lock()
		delete(c.l.serving, j.id)
		c.l.mu.Unlock()
	}()
	// The answer goes with the first data frame, in one write: the
	// initiator wakes once for both.
	h := header{kind: kResp, sub: rRead, id: j.id, a: j.total}
	h.put(c.lhdr[:])
	_, err := c.sendChunks(c.leadOf(c.lhdr[:]), j.id, j.segs, j.total, nil, func() uint8 {
		if j.stop.Load() {
			return stCancelled
		}
		for _, r := range j.regs {
			if r.closed.Load() {
				st := c.l.e.goneStatus()
				c.l.e.refuse(c.l.p.name, "read", st, "region "+r.label()+" deregistered during the transfer")
				return st
			}
		}
		return stOK
	})
	return err
}

// serveNow answers a small read of host memory (the checked ranges
// c.segs) with its bytes at once on connection w, from the reader's
// goroutine (direct): the answer and one data frame. It reports false
// when it did not.
func (c *conn) serveNow(w *conn, id, total uint64) bool {
	if total > directMax-2*HeaderSize {
		return false
	}
	for _, s := range c.segs {
		if s.d != nil {
			return false
		}
	}
	return w.direct(true, func(b []byte) []byte {
		b = appendHeader(b, header{kind: kResp, sub: rRead, id: id, a: total})
		b = appendHeader(b, header{kind: kData, id: id, payload: uint32(total)})
		for _, s := range c.segs {
			b = append(b, s.b...)
		}
		return b
	})
}

// reader reads frames until the link ends; every frame's header must
// start to come within the heartbeat deadline, and a data frame's bytes
// all within one after its header (recvChunks).
//
// Between frames it waits for the socket without reading it (turn), so
// that a Wait may take the socket and read its answer itself
// (own_linux.go); it holds the socket from a frame's first bytes to its
// end, and on while bytes of the next are buffered.
func (c *conn) reader() {
	defer c.ended.Store(true)
	for {
		err := c.turn()
		if err == errConnEnded {
			return // a Wait met the connection's end and handled it
		}
		var h header
		if err == nil {
			h, err = c.header()
		}
		if err != nil {
			c.readErr(err, true)
			return
		}
		if err = c.dispatch(h); err != nil {
			c.readErr(err, false)
			return
		}
		if c.rd.Buffered() == 0 {
			// Any byte wakes the next wait, the reader's or a Wait's
			// (the poller's readiness obeys a large read's low-water
			// mark).
			c.rd.SetLowat(1)
			c.own.Store(ownFree)
		}
	}
}

// connEnded records that the peer closed one of the link's connections:
// its reader, reading a frame's header, met the connection's end or a
// reset (a socket closed with bytes unread resets). The link fails with
// err at once when every connection has ended, else closeGrace later (or
// at the others' ends), so that what the peer sent on the others before
// it closed them is read first. It reports false when the link fails now.
func (l *link) connEnded(err error) bool {
	l.mu.Lock()
	l.closedConns++
	first, all := l.closedConns == 1, l.closedConns == len(l.conns)
	l.mu.Unlock()
	if all {
		return false
	}
	if first {
		go func() {
			t := time.NewTimer(min(closeGrace, l.hb/4))
			defer t.Stop()
			select {
			case <-t.C:
				l.fail(err)
			case <-l.stop:
			}
		}()
	}
	return true
}

// readDeadline makes the next reads end by the heartbeat deadline. A
// Reader that keeps a deadline of its own (one that polls before it
// parks) is told through its SetDeadline; otherwise the socket's read
// deadline is set.
func (c *conn) readDeadline() {
	d := time.Now().Add(c.l.hb)
	if r, ok := any(&c.rd).(interface{ SetDeadline(time.Time) }); ok {
		r.SetDeadline(d)
		return
	}
	c.c.SetReadDeadline(d)
}

// header reads the next frame's header; after a small frame, with what
// follows it in the same system call (a small frame's payload, the next
// frames), which the next reads take first.
func (c *conn) header() (header, error) {
	c.frames.Add(1)
	c.readDeadline()
	var err error
	if c.ahead {
		err = c.rd.ReadAhead(c.rhdr[:], inter.AheadMax)
	} else {
		err = c.rd.ReadFull(c.rhdr[:])
	}
	if err != nil {
		return header{}, err
	}
	h, err := decodeHeader(c.rhdr[:])
	c.ahead = h.payload < inter.AheadMax
	return h, err
}

func (c *conn) readFull(b []byte) error {
	c.readDeadline()
	return c.rd.ReadFull(b)
}

// discard reads n bytes to nowhere, by the read deadline set.
func (c *conn) discard(n int) error {
	if c.scratch == nil {
		c.scratch = make([]byte, 64<<10)
	}
	for n > 0 {
		m := min(n, len(c.scratch))
		if err := c.rd.ReadFull(c.scratch[:m]); err != nil {
			return err
		}
		n -= m
	}
	return nil
}

// recvChunks reads total bytes of data frames for id into segs (to
// nowhere when into is false), each chunk under lock when it is not nil
// and only while ok holds; it returns the end frame's status if the
// sender stopped early.
func (c *conn) recvChunks(id, total uint64, segs []seg, lock *sync.Mutex, ok func() bool) (uint8, error) {
	k := cursor{segs: segs}
	var devErr error
	for got := uint64(0); got < total; {
		h, err := c.header()
		if err != nil {
			return 0, err
		}
		if h.id != id || (h.kind != kData && h.kind != kEnd) {
			return 0, fmt.Errorf("%w: kind %d for request %d inside the bytes of request %d", ErrFrame, h.kind, h.id, id)
		}
		if h.kind == kEnd {
			return h.status, nil
		}
		n := uint64(h.payload)
		if n > total-got {
			return 0, fmt.Errorf("%w: %d bytes more than request %d's %d", ErrFrame, got+n-total, id, total)
		}
		if lock != nil {
			lock.Lock()
		}
		// The frame's bytes come within a heartbeat, however they
		// trickle in: one deadline for the frame, not one per read, so
		// that the part's lock is held for a heartbeat at most.
		c.readDeadline()
		if segs == nil || !ok() {
			err = c.discard(int(n))
			segs = nil
		} else if c.vbufs = c.hostSegs(&k, int(n)); c.vbufs != nil {
			// Host memory only (pages of a batch): read together, one
			// system call per wake-up (inter.Reader.ReadFullVec).
			err = c.rd.ReadFullVec(c.vbufs)
			clear(c.vbufs) // keep no buffer alive
		} else {
			for left := int(n); left > 0 && err == nil; {
				s := k.next(left)
				if s.d == nil {
					err = c.rd.ReadFull(s.b)
				} else {
					if c.rstage == nil {
						c.rstage = make([]byte, ChunkMax)
					}
					if err = c.rd.ReadFull(c.rstage[:s.n]); err == nil && devErr == nil {
						devErr = s.fromHost(c.rstage)
					}
				}
				left -= s.n
			}
		}
		if lock != nil {
			lock.Unlock()
		}
		if err != nil {
			return 0, err
		}
		got += n
	}
	if devErr != nil { // the bytes could not be put in GPU memory
		return stDevice, nil
	}
	return stOK, nil
}

// hostSegs takes the next n bytes of k as host memory, into c.vbufs's
// array, when they are all host memory; otherwise it takes nothing and
// returns nil (GPU memory is staged a segment at a time).
func (c *conn) hostSegs(k *cursor, n int) [][]byte {
	save := *k
	out := c.vbufs[:0]
	for left := n; left > 0; {
		s := k.next(left)
		if s.d != nil {
			*k = save
			return nil
		}
		out = appendPiece(out, s.b)
		left -= s.n
	}
	return out
}

// stripe cuts segs, in place, to the n bytes from lo of their
// concatenation (which holds them: decodeDescs checked).
func stripe(segs []seg, lo, n uint64) []seg {
	out := segs[:0]
	for _, s := range segs {
		if lo >= uint64(s.n) {
			lo -= uint64(s.n)
			continue
		}
		s = s.sub(int(lo), int(min(uint64(s.n)-lo, n)))
		lo = 0
		if s.n > 0 {
			out = append(out, s)
		}
		n -= uint64(s.n)
		if n == 0 {
			break
		}
	}
	return out
}

// dispatch handles one frame and everything that belongs to it.
func (c *conn) dispatch(h header) error {
	fenceAcquire()
	l := c.l
	switch h.kind {
	case kPing:
		return nil
	case kHello, kHelloAck, kData, kEnd:
		return fmt.Errorf("%w: a frame of kind %d out of place", ErrFrame, h.kind)
	case kResp:
		return c.response(h)
	case kRelease:
		l.released(h.id)
		return nil
	case kRevoke:
		l.revoked(h.id)
		return nil
	case kCancel:
		l.mu.Lock()
		if stop := l.serving[h.id]; stop != nil {
			stop.Store(true)
		}
		l.mu.Unlock()
		return nil
	}
	// A request: its answer goes to a connection's writer (a read's, the
	// one it names; others, this one), whose queue enqueue bounds
	// (maxQueued) against a peer that does not read its answers.
	w := c
	if h.sub == rRead {
		if int(h.ch) >= len(l.conns) {
			return fmt.Errorf("%w: a read answered on connection %d of %d", ErrFrame, h.ch, len(l.conns))
		}
		w = l.conns[h.ch]
	}
	switch h.sub {
	case rRead, rWrite, rWriteImm, rReadV, rWriteV, rReadG, rWriteG, rLease, rLeaseG:
		if cap(c.desc) < int(h.payload) {
			c.desc = make([]byte, h.payload)
		}
		if err := c.readFull(c.desc[:h.payload]); err != nil {
			return err
		}
		pl := c.desc[:h.payload]
		var imm uint64
		withImm := h.sub == rWriteImm
		if withImm { // a write, then its immediate; answered as a write
			imm = binary.LittleEndian.Uint64(pl[len(pl)-immSize:])
			if imm > 0xffffffff {
				return fmt.Errorf("%w: an immediate of %d", ErrFrame, imm)
			}
			pl, h.sub = pl[:len(pl)-immSize], rWrite
		}
		var err error
		var lo uint64
		if c.descs, lo, err = decodeDescs(pl, int(h.b), h.a, c.descs); err != nil {
			return err
		}
		var st uint8
		var why string
		c.segs, c.regs, st, why = l.e.acquire(l.p, c.descs, c.segs, c.regs)
		if st == stOK {
			c.segs = stripe(c.segs, lo, h.a)
		}
		op := map[uint8]string{rRead: "read", rWrite: "write", rReadV: "read", rWriteV: "write", rReadG: "read", rWriteG: "write"}[h.sub]
		if st != stOK {
			if h.sub != rLease && h.sub != rLeaseG { // a lease refused: the transfer that asked it is refused itself
				l.e.refuse(l.p.name, op, st, why)
			}
			l.enqueue(w.idx, frame{kind: kResp, sub: h.sub, id: h.id, status: st})
			if h.sub == rWrite {
				_, err := c.recvChunks(h.id, h.a, nil, nil, nil)
				return err
			}
			return nil
		}
		if h.sub == rReadV || h.sub == rWriteV || h.sub == rReadG || h.sub == rWriteG || h.sub == rLease || h.sub == rLeaseG {
			c.grant(h.id, h.sub, c.segs, c.regs)
			return nil
		}
		if h.sub == rRead {
			if c.serveNow(w, h.id, h.a) {
				l.e.release(l.p, c.regs)
				return nil
			}
			segs := append([]seg(nil), c.segs...)
			regs := append([]*Region(nil), c.regs...)
			stop := new(atomic.Bool)
			l.mu.Lock()
			l.serving[h.id] = stop
			l.mu.Unlock()
			l.enqueue(w.idx, serveRead{id: h.id, total: h.a, segs: segs, regs: regs, stop: stop})
			return nil
		}
		regs := c.regs
		closed := false
		st, err = c.recvChunks(h.id, h.a, c.segs, nil, func() bool {
			for _, r := range regs {
				if r.closed.Load() {
					if !closed {
						closed = true
						st := l.e.goneStatus()
						l.e.refuse(l.p.name, "write", st, "region "+r.label()+" deregistered during the transfer")
						l.enqueue(c.idx, frame{kind: kResp, sub: rWrite, id: h.id, status: st})
						// Nothing is written from here on (the rest is
						// read to nowhere): Deregister need not wait for
						// the peer's remaining bytes.
						l.e.release(l.p, regs)
					}
					return false
				}
			}
			return true
		})
		if !closed {
			l.e.release(l.p, regs)
		}
		if st == stDevice && err == nil && !closed {
			l.enqueue(c.idx, frame{kind: kResp, sub: rWrite, id: h.id, status: stDevice})
		}
		if err != nil || closed || st != stOK { // an end frame: the writer gave up; it expects no answer
			return err
		}
		st = stOK
		if withImm && !l.e.pushImm(l.imm, uint32(imm)) {
			st = stBusy // the bytes are in place, the immediate refused
		}
		l.enqueue(c.idx, frame{kind: kResp, sub: rWrite, id: h.id, status: st})
	case rImm:
		st := stOK
		if !l.e.pushImm(l.imm, uint32(h.a)) {
			st = stBusy
		}
		l.enqueue(c.idx, frame{kind: kResp, sub: rImm, id: h.id, status: st})
	case rRTS:
		return l.rtsArrived(c, h.id, h.a)
	case rCTS:
		return l.ctsArrived(h.id, h.status)
	case rSend:
		return c.sendArrived(h)
	}
	return nil
}

// response handles the answer to one of this side's requests.
func (c *conn) response(h header) error {
	l := c.l
	if h.sub == rLease || h.sub == rLeaseG {
		return c.leaseAnswered(h)
	}
	l.mu.Lock()
	var p *part
	if h.sub == rSend {
		p = l.sends[h.id]
	} else {
		p = l.parts[h.id]
	}
	l.mu.Unlock()
	if p != nil && h.sub != rSend {
		// The answer must be of the request's kind: a read's answer to a
		// write would have its bytes land in the write's source, a
		// grant of the other direction would copy the wrong way.
		p.mu.Lock()
		sub := p.sub
		p.mu.Unlock()
		if h.sub != sub {
			return fmt.Errorf("%w: an answer of kind %d to request %d of kind %d", ErrFrame, h.sub, h.id, sub)
		}
	}
	if h.status == stNotHost && p != nil && (p.sub == rReadV || p.sub == rWriteV || p.sub == rReadG || p.sub == rWriteG) {
		// The peer's range is not memory of the kind asked (GPU memory
		// for a host grant, host memory for an IPC one): over TCP.
		c.overTCP(p)
		return nil
	}
	if h.status != stOK {
		if p != nil {
			p.finish(c.refusal(p, h.status))
		}
		return nil
	}
	if h.sub == rReadV || h.sub == rWriteV {
		return c.granted(h, p)
	}
	if h.sub == rReadG || h.sub == rWriteG {
		return c.ipcGranted(h, p)
	}
	if h.sub != rRead {
		if p != nil {
			p.finish(nil)
		}
		return nil
	}
	// A read's bytes follow; a part given up reads them to nowhere.
	var segs []seg
	var lock *sync.Mutex
	if p != nil {
		if p.total != h.a {
			return fmt.Errorf("%w: a read of %d bytes answered with %d", ErrFrame, p.total, h.a)
		}
		segs, lock = p.local, &p.mu
	}
	st, err := c.recvChunks(h.id, h.a, segs, lock, func() bool { return p.active })
	if err != nil {
		return err
	}
	if p != nil {
		if st != stOK {
			p.finish(c.refusal(p, st))
		} else {
			p.finish(nil)
		}
	}
	return nil
}

// overTCP sends same-host part p's request again as a TCP one (rRead or
// rWrite), its grant having been refused (stNotHost) or given back.
func (c *conn) overTCP(p *part) {
	p.mu.Lock()
	if !p.active { // given up meanwhile: its Future may be done
		p.mu.Unlock()
		return
	}
	p.sub = map[uint8]uint8{rReadV: rRead, rWriteV: rWrite, rReadG: rRead, rWriteG: rWrite}[p.sub]
	p.f.tcp.Store(true) // Transport may be read meanwhile: not f.transport
	p.mu.Unlock()
	c.l.enqueue(c.idx, reqJob{p: p})
}

func (c *conn) refusal(p *part, st uint8) error {
	region := p.f.label()
	if region == "" && len(p.descs) == 1 {
		region = "id " + itoa(p.descs[0].region)
	}
	return &OpError{Op: p.f.op, Peer: c.l.p.name, Region: region, Err: statusErr(st)}
}

// rtsArrived: the peer will send seq, of n bytes. It is matched with this
// side's receive of the same sequence, now or when that is posted. A
// sequence announced twice breaks the protocol.
func (l *link) rtsArrived(c *conn, seq, n uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, refused := l.rtsRefused[seq]
	if _, again := l.rts[seq]; again || refused || l.recvs[seq] != nil && l.recvs[seq].cts {
		return fmt.Errorf("%w: send %d announced twice", ErrFrame, seq)
	}
	if r := l.recvs[seq]; r != nil {
		l.matchLocked(r, n)
		return nil
	}
	if seq < l.recvSeq { // its receive was cancelled
		l.enqueue(int(seq%uint64(len(l.conns))), frame{kind: kReq, sub: rCTS, id: seq, status: stCancelled})
		return nil
	}
	if len(l.rts) >= maxPendingRTS {
		if len(l.rtsRefused) < maxPendingRTS {
			l.rtsRefused[seq] = struct{}{}
		}
		l.enqueue(int(seq%uint64(len(l.conns))), frame{kind: kReq, sub: rCTS, id: seq, status: stBusy})
		return nil
	}
	l.rts[seq] = n
	return nil
}

// matchLocked answers the sender of r's sequence, which sends n bytes.
func (l *link) matchLocked(r *part, n uint64) {
	ch := int(r.id % uint64(len(l.conns)))
	if n > r.total {
		l.enqueue(ch, frame{kind: kReq, sub: rCTS, id: r.id, status: stTooLarge})
		go r.finish(opErr("recv", l.p.name, "", ErrRefused, "a message of %d bytes, the receive holds %d", n, r.total))
		return
	}
	r.f.n.Store(int64(n))
	r.total = n
	r.cts = true
	l.enqueue(ch, frame{kind: kReq, sub: rCTS, id: r.id})
}

// ctsArrived: the peer posted the receive for this side's send seq. A
// send is cleared once: a second clear would queue its bytes again.
func (l *link) ctsArrived(seq uint64, st uint8) error {
	l.mu.Lock()
	p := l.sends[seq]
	again := p != nil && p.cts
	if p != nil && st == stOK {
		p.cts = true
	}
	l.mu.Unlock()
	if again {
		return fmt.Errorf("%w: send %d cleared twice", ErrFrame, seq)
	}
	ch := int(seq % uint64(len(l.conns)))
	if p == nil {
		if st == stOK { // the send was cancelled: tell the receiver
			l.enqueue(ch, abandonedSend(seq))
		}
		return nil
	}
	if st == stBusy { // not statusText's (an immediate's) reason
		p.finish(opErr("send", l.p.name, "", ErrRefused, "the peer holds too many sends announced before their receives (%d): this one is not received", maxPendingRTS))
		return nil
	}
	if st != stOK {
		p.finish(&OpError{Op: "send", Peer: l.p.name, Err: statusErr(st)})
		return nil
	}
	l.enqueue(ch, sendJob{p: p})
	return nil
}

// sendArrived reads the bytes of a send into its receive.
func (c *conn) sendArrived(h header) error {
	l := c.l
	l.mu.Lock()
	r := l.recvs[h.id]
	cleared := r != nil && r.cts
	l.mu.Unlock()
	if r != nil && !cleared && h.status == stOK {
		// Bytes for a receive this side never cleared (no clear-to-send
		// went out for it): the sender broke the protocol.
		return fmt.Errorf("%w: the bytes of send %d, which was never cleared to send", ErrFrame, h.id)
	}
	if h.status != stOK { // the sender gave the send up
		if r != nil {
			r.finish(&OpError{Op: "recv", Peer: l.p.name, Err: statusErr(h.status)})
		}
		return nil
	}
	var segs []seg
	var lock *sync.Mutex
	if r != nil {
		if h.a != r.total {
			return fmt.Errorf("%w: a send of %d bytes announced as %d", ErrFrame, h.a, r.total)
		}
		segs, lock = r.local, &r.mu
	}
	st, err := c.recvChunks(h.id, h.a, segs, lock, func() bool { return r.active })
	if err != nil {
		return err
	}
	if r == nil {
		l.mu.Lock()
		posted := h.id < l.recvSeq
		l.mu.Unlock()
		if !posted { // never cleared: no receive of that sequence was posted
			return fmt.Errorf("%w: the bytes of send %d, which was never cleared to send", ErrFrame, h.id)
		}
		if st == stOK { // its receive was given up after it cleared the send
			l.enqueue(c.idx, frame{kind: kResp, sub: rSend, id: h.id, status: stCancelled})
		}
		return nil
	}
	if st != stOK {
		if st == stDevice {
			l.enqueue(c.idx, frame{kind: kResp, sub: rSend, id: h.id, status: stDevice})
		}
		r.finish(&OpError{Op: "recv", Peer: l.p.name, Err: statusErr(st)})
		return nil
	}
	r.mu.Lock()
	live := r.active
	r.mu.Unlock()
	if live {
		l.enqueue(c.idx, frame{kind: kResp, sub: rSend, id: h.id})
	} else {
		l.enqueue(c.idx, frame{kind: kResp, sub: rSend, id: h.id, status: stCancelled})
	}
	r.finish(nil)
	return nil
}
