package p2p

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/slimego/slimego/inter"
	"github.com/slimego/slimego/internal/machine"
)

// The same-host transport ("cma", cross-memory attach). The request and
// its answer travel on the link's connections as over TCP, and the target
// checks the request just as it does there; but instead of the bytes its
// answer grants the memory of the checked ranges (their addresses), and
// the initiator copies them itself with process_vm_readv or
// process_vm_writev, a chunk at a time, each chunk cut among threads
// (vmCopy): one copy, kernel to kernel, no socket. The
// initiator copies in a goroutine of its own, under its part's lock,
// chunk by chunk, so that a cancelled transfer stops touching this side's
// memory at once, as over TCP; it then releases the grant (kRelease), and
// until then the target counts the request as in flight on its regions
// (Deregister waits for it). A link uses it when the peer's Info says it
// runs on this host (the same boot and pid namespace), the process at the
// Info's pid holds the link's sockets (heldBy), and a probe read of the
// peer's token at the address its Info gives returns the token (ptrace
// permission); then a pidfd watches the peer, so that its exit fails the
// link at once even before its sockets close.

// cmaChunk is the most one process_vm call copies.
const cmaChunk = 4 << 20

// iovMax bounds the iovecs of one process_vm call (the kernel's UIO_MAXIOV).
const iovMax = 1024

// enableCMA switches l to the same-host transport if the peer described
// by in can be reached so; it reports whether l uses it.
func (l *link) enableCMA(in info) bool {
	e := l.e
	if l.cma.Load() {
		return true
	}
	if e.opts.TCPOnly || !machine.SamePIDSpace(in.host, e.host) || in.pid == 0 || in.tokenAddr == 0 {
		return false
	}
	// The Info is the peer's word, and every member reads every Info in
	// the store: a hostile one could give another process's pid, host
	// and token (or this process's own), and its grants would then be
	// applied to that process's memory. The pid counts only if that
	// process holds the far end of the link's sockets; a pidfd taken
	// first pins it, so that it cannot exit and be reused meanwhile.
	self := in.pid == uint32(unix.Getpid())
	pidfd := -1
	if !self {
		fd, err := unix.PidfdOpen(int(in.pid), 0)
		if err != nil {
			return false
		}
		pidfd = fd
	}
	keep := false
	defer func() {
		if !keep && pidfd >= 0 {
			unix.Close(pidfd)
		}
	}()
	if !l.heldBy(int(in.pid)) {
		return false
	}
	var got uint64
	local := []unix.Iovec{{Base: (*byte)(unsafe.Pointer(&got)), Len: 8}}
	remote := []unix.RemoteIovec{{Base: uintptr(in.tokenAddr), Len: 8}}
	if n, err := unix.ProcessVMReadv(int(in.pid), local, remote, 0); err != nil || n != 8 || got != in.token {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.shut || l.failed() != nil {
		return false
	}
	if pidfd >= 0 {
		// Still running: not a process that exited after the checks.
		fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
		if n, err := unix.Poll(fds, 0); err != nil || n != 0 {
			return false
		}
	}
	if l.cma.Load() { // another Connect enabled it meanwhile (under e.mu too)
		return true
	}
	l.pid = int(in.pid) // before cma is set: transfers read it after they see cma
	l.self = self
	l.ipcOff.Store(self)
	if pidfd >= 0 {
		// A pidfd of the link's own, for taking the peer's Shared
		// memory (mapPeer); closed when the link has ended.
		if fd, err := unix.FcntlInt(uintptr(pidfd), unix.F_DUPFD_CLOEXEC, 0); err == nil {
			l.mu.Lock()
			if l.err == nil {
				l.pidfd = fd
			} else {
				unix.Close(fd)
			}
			l.mu.Unlock()
		}
	}
	l.cma.Store(true)
	if pidfd >= 0 {
		keep = true
		e.wg.Add(1)
		go func() { defer e.wg.Done(); l.watch(pidfd) }()
	}
	return true
}

// heldBy reports whether process pid holds the far end of every one of
// l's connections: in its network namespace (/proc/pid/net/tcp and tcp6)
// a socket's local address is the connection's remote one and its remote
// address the connection's local one, and that socket is among
// /proc/pid/fd. A 4-tuple names one socket in a namespace, so no other
// process can pass this for a link it does not hold.
func (l *link) heldBy(pid int) bool {
	want := map[sockEnds]bool{}
	for _, c := range l.conns {
		lo, ok1 := c.c.LocalAddr().(*net.TCPAddr)
		re, ok2 := c.c.RemoteAddr().(*net.TCPAddr)
		if !ok1 || !ok2 {
			return false
		}
		la, ra := lo.AddrPort(), re.AddrPort()
		want[sockEnds{unmap(ra), unmap(la)}] = true
	}
	inodes := map[string]bool{}
	dir := "/proc/" + strconv.Itoa(pid)
	for _, table := range []string{"/net/tcp", "/net/tcp6"} {
		if b, err := os.ReadFile(dir + table); err == nil {
			tableInodes(b, want, inodes)
		}
	}
	if len(inodes) != len(want) {
		return false
	}
	fds, err := os.ReadDir(dir + "/fd")
	if err != nil {
		return false
	}
	found := 0
	for _, fd := range fds {
		if t, err := os.Readlink(dir + "/fd/" + fd.Name()); err == nil && inodes[t] {
			delete(inodes, t)
			found++
		}
	}
	return found == len(want)
}

// sockEnds is a TCP socket's local and remote address.
type sockEnds struct{ local, remote netip.AddrPort }

// tableInodes adds to inodes, as "socket:[inode]", the inode of each
// socket in b (the text of a /proc/pid/net/tcp or tcp6) whose ends are in
// want. A busy host's table lists every socket of the namespace, time-wait
// ones too (tens of thousands), so lines are walked in place, and only
// those whose local port is a wanted one are parsed.
func tableInodes(b []byte, want map[sockEnds]bool, inodes map[string]bool) {
	ports := map[uint16]bool{}
	for e := range want {
		ports[e.local.Port()] = true
	}
	first := true
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		if first { // the header
			first = false
			continue
		}
		var f [10][]byte
		if fields(line, f[:2]) < 2 {
			continue
		}
		if p, ok := hexPort(f[1]); !ok || !ports[p] || fields(line, f[:]) < len(f) {
			continue
		}
		lo, err1 := procAddr(string(f[1]))
		re, err2 := procAddr(string(f[2]))
		if err1 == nil && err2 == nil && want[sockEnds{lo, re}] && string(f[9]) != "0" {
			inodes["socket:["+string(f[9])+"]"] = true
		}
	}
}

// fields fills f with line's first len(f) fields (separated by spaces)
// and returns how many it found.
func fields(line []byte, f [][]byte) int {
	n := 0
	for n < len(f) {
		for len(line) > 0 && line[0] == ' ' {
			line = line[1:]
		}
		if len(line) == 0 {
			break
		}
		i := bytes.IndexByte(line, ' ')
		if i < 0 {
			i = len(line)
		}
		f[n], line = line[:i], line[i:]
		n++
	}
	return n
}

// hexPort is the port of a /proc/net/tcp address (the four hex digits
// after its colon), or false where it has none.
func hexPort(a []byte) (uint16, bool) {
	i := bytes.LastIndexByte(a, ':')
	if i < 0 || len(a)-i-1 != 4 {
		return 0, false
	}
	var p uint16
	for _, c := range a[i+1:] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		default:
			return 0, false
		}
		p = p<<4 | uint16(c)
	}
	return p, true
}

// unmap is a as /proc/net/tcp shows it: IPv4 in IPv6 as IPv4, no zone.
func unmap(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap().WithZone(""), a.Port())
}

// procAddr parses an address of /proc/net/tcp or tcp6: the address as
// 32-bit words in hex, each in the host's byte order, a colon and the
// port in hex.
func procAddr(s string) (netip.AddrPort, error) {
	h, p, ok := strings.Cut(s, ":")
	port, err := strconv.ParseUint(p, 16, 16)
	if !ok || err != nil || (len(h) != 8 && len(h) != 32) {
		return netip.AddrPort{}, fmt.Errorf("address %q", s)
	}
	var b [16]byte
	for i := 0; i < len(h)/8; i++ {
		w, err := strconv.ParseUint(h[8*i:8*i+8], 16, 32)
		if err != nil {
			return netip.AddrPort{}, fmt.Errorf("address %q", s)
		}
		binary.NativeEndian.PutUint32(b[4*i:], uint32(w))
	}
	var a netip.Addr
	if len(h) == 8 {
		a = netip.AddrFrom4([4]byte(b[:4]))
	} else {
		a = netip.AddrFrom16(b).Unmap()
	}
	return netip.AddrPortFrom(a, uint16(port)), nil
}

// watch fails l when the peer's process exits (its pidfd becomes
// readable), or returns when l ends.
func (l *link) watch(fd int) {
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 100)
		if err == nil && n > 0 {
			l.fail(opErr("watch", l.p.name, "", ErrPeerLost, "its process (pid %d) exited", l.pid))
			return
		}
		select {
		case <-l.stop:
			return
		default:
		}
	}
}

// grantJob answers a same-host request with the addresses of its ranges.
type grantJob struct {
	id  uint64
	sub uint8
	n   uint32 // iovecs or IPC records
	iov []byte
}

func (j grantJob) write(c *conn) error {
	return c.send(header{kind: kResp, sub: j.sub, id: j.id, b: j.n, payload: uint32(len(j.iov))}, j.iov)
}

// grant records the checked ranges segs (on regs) of request id as lent
// to the initiator and queues their addresses; the references on regs are
// dropped when the initiator releases them or the link ends.
func (c *conn) grant(id uint64, sub uint8, segs []seg, regs []*Region) {
	l := c.l
	if !l.grantable() {
		// Not a process on this host that could copy through the
		// addresses (a member elsewhere, or one giving another pid):
		// the request goes over TCP, as one for GPU memory does.
		l.e.release(l.p, regs)
		l.enqueue(c.idx, frame{kind: kResp, sub: sub, id: id, status: stNotHost})
		return
	}
	var iov []byte
	if sub == rReadG || sub == rWriteG || sub == rLeaseG {
		// GPU memory: IPC handles (ipc.go); anything else over TCP.
		var ok bool
		if iov, ok = ipcRecords(segs); !ok {
			l.e.release(l.p, regs)
			l.enqueue(c.idx, frame{kind: kResp, sub: sub, id: id, status: stNotHost})
			return
		}
	} else {
		iov = make([]byte, len(segs)*IovSize)
	}
	for i, s := range segs {
		if sub == rReadG || sub == rWriteG || sub == rLeaseG {
			break
		}
		if s.d != nil { // GPU memory has no address to lend: over TCP instead
			l.e.release(l.p, regs)
			l.enqueue(c.idx, frame{kind: kResp, sub: sub, id: id, status: stNotHost})
			return
		}
		v := iov[i*IovSize:]
		binary.LittleEndian.PutUint64(v, uint64(uintptr(unsafe.Pointer(unsafe.SliceData(s.b)))))
		binary.LittleEndian.PutUint64(v[8:], uint64(len(s.b)))
		if s.sh != nil { // its memory file, for the initiator to map
			binary.LittleEndian.PutUint64(v[16:], s.sh.id)
			binary.LittleEndian.PutUint64(v[24:], s.sh.offset(s.b))
			binary.LittleEndian.PutUint32(v[32:], uint32(s.sh.fd))
		}
	}
	regs = append([]*Region(nil), regs...)
	l.mu.Lock()
	if l.err != nil || l.grants[id] != nil {
		l.mu.Unlock()
		l.e.release(l.p, regs)
		return
	}
	if len(l.grants) >= maxGrants || l.grantRefs+len(regs) > maxGrantRefs {
		// A peer holds too many grants (one that never releases them
		// would make this side hold memory without end): the request
		// goes over TCP instead, as one for GPU memory does.
		l.mu.Unlock()
		l.e.release(l.p, regs)
		l.enqueue(c.idx, frame{kind: kResp, sub: sub, id: id, status: stNotHost})
		return
	}
	l.grants[id] = regs
	l.grantRefs += len(regs)
	l.mu.Unlock()
	n := uint32(len(segs))
	if !(HeaderSize+len(iov) <= directMax && c.direct(true, func(b []byte) []byte {
		b = appendHeader(b, header{kind: kResp, sub: sub, id: id, b: n, payload: uint32(len(iov))})
		return append(b, iov...)
	})) {
		l.enqueue(c.idx, grantJob{id: id, sub: sub, n: n, iov: iov})
	}
	if sub == rLease || sub == rLeaseG {
		// Recorded once the grant is queued, so that a revocation goes
		// after it on this connection; a Deregister that ran meanwhile
		// did not see it, and it is revoked here instead (whichever
		// takes it out of l.leased sends the one kRevoke).
		l.mu.Lock()
		if l.err == nil && l.grants[id] != nil {
			l.leased[id] = c.idx
		}
		l.mu.Unlock()
		if regs[0].closed.Load() {
			l.revokeLocal(regs[0])
		}
	}
}

// grantable reports whether this side's memory may be granted to the
// peer: the process it says it is (its hello's pid, or its Info's when
// this side dialed) holds the far end of the link's sockets. It is
// checked once per link, at the first same-host request.
func (l *link) grantable() bool {
	l.grantOnce.Do(func() {
		if l.peerPid == 0 {
			return
		}
		// A pidfd first, so that the process checked is the one pinned.
		fd, err := unix.PidfdOpen(int(l.peerPid), 0)
		if err != nil {
			fd = -1 // a kernel without pidfds: the link's end waits a heartbeat
		}
		l.grantOK = l.heldBy(int(l.peerPid))
		l.mu.Lock()
		if l.grantOK && l.err == nil && fd >= 0 {
			l.grantPidfd, fd = fd, -1
		}
		l.mu.Unlock()
		if fd >= 0 {
			unix.Close(fd)
		}
	})
	return l.grantOK
}

// waitExit returns once the process of pidfd fd (closed here) has exited,
// or after d (always after d where fd is -1).
func waitExit(fd int, d time.Duration) {
	if fd < 0 {
		time.Sleep(d)
		return
	}
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for end := time.Now().Add(d); ; {
		left := time.Until(end)
		if left <= 0 {
			return
		}
		n, err := unix.Poll(fds, int(min(left.Milliseconds()+1, 1<<30)))
		switch {
		case err == nil && n > 0: // exited
			return
		case err != nil && err != unix.EINTR: // cannot tell: the full wait
			time.Sleep(left)
			return
		}
	}
}

// released ends the grant of request id.
func (l *link) released(id uint64) {
	l.mu.Lock()
	regs := l.grants[id]
	delete(l.grants, id)
	delete(l.leased, id)
	l.grantRefs -= len(regs)
	l.mu.Unlock()
	l.e.release(l.p, regs)
}

// grantIov is one range of a grant (see rReadV): at addr in the peer's
// process, or, where mem is not 0, also at off in the peer's Shared
// memory mem, its file at fd there.
type grantIov struct {
	addr, n, mem, off uint64
	fd                uint32
	m                 *peerMap // the mapping of mem, once made (nil: copy at addr)
}

// granted copies a same-host part's bytes through the grant its answer
// h carries (the iovecs follow h), then releases the grant.
func (c *conn) granted(h header, p *part) error {
	if cap(c.desc) < int(h.payload) {
		c.desc = make([]byte, h.payload)
	}
	b := c.desc[:h.payload]
	if err := c.readFull(b); err != nil {
		return err
	}
	if p == nil { // given up: the grant goes back unused
		c.l.enqueue(c.idx, frame{kind: kRelease, id: h.id})
		return nil
	}
	rem := make([]grantIov, h.b)
	var sum uint64
	for i := range rem {
		v := b[i*IovSize:]
		g := grantIov{addr: binary.LittleEndian.Uint64(v), n: binary.LittleEndian.Uint64(v[8:]),
			mem: binary.LittleEndian.Uint64(v[16:]), off: binary.LittleEndian.Uint64(v[24:]), fd: binary.LittleEndian.Uint32(v[32:])}
		zero := binary.LittleEndian.Uint32(v[36:])
		if g.n == 0 || g.n > MaxLen || g.off > MaxLen || zero != 0 || g.mem == 0 && (g.off != 0 || g.fd != 0) {
			c.l.enqueue(c.idx, frame{kind: kRelease, id: h.id})
			return fmt.Errorf("%w: a grant of %d bytes (memory %#x, offset %d, fd %d)", ErrFrame, g.n, g.mem, g.off, g.fd)
		}
		sum += g.n
		rem[i] = g
	}
	if sum != p.total {
		c.l.enqueue(c.idx, frame{kind: kRelease, id: h.id})
		return fmt.Errorf("%w: a grant of %d bytes for a request of %d", ErrFrame, sum, p.total)
	}
	// The copy runs in a goroutine of its own, so that the reader goes on
	// reading while it lasts: a long copy (or one that waits for the
	// peer's pages) neither holds up the other frames of the connection
	// nor hides that the link has failed (which ends the copy at its next
	// chunk).
	l, idx, write := c.l, c.idx, h.sub == rWriteV
	l.wg.Add(1) // the reader counts in l.wg: it is not at zero
	l.grantCopies.Add(1)
	go func() {
		defer l.wg.Done()
		err := l.grantCopy(p, rem, write)
		l.enqueue(idx, frame{kind: kRelease, id: h.id})
		l.grantCopies.Add(-1)
		if err != nil {
			p.finish(opErr(p.f.op, l.p.name, p.f.label(), ErrPeerLost, "copying through the grant: %v", err))
			return
		}
		if lerr := l.failed(); lerr != nil { // as leaseCopy: a peer's mapping outlives it
			p.finish(asOp(p.f.op, l.p.name, lerr))
			return
		}
		p.finish(nil)
	}()
	return nil
}

// grantCopy copies p's bytes from (write false) or to (write true) the
// peer's ranges rem, a chunk at a time under p's lock, while p is active:
// through a mapping of the peer's Shared memory where a range lies in
// one and it can be mapped, with process_vm_readv/writev elsewhere.
func (l *link) grantCopy(p *part, rem []grantIov, write bool) error {
	for i := range rem {
		g := &rem[i]
		if g.m != nil { // a lease's mapping (leaseCopy)
			p.f.shm.Store(true)
			continue
		}
		if g.mem == 0 {
			continue
		}
		if i > 0 && rem[i-1].mem == g.mem && rem[i-1].m != nil && g.off+g.n <= uint64(len(rem[i-1].m.b)) {
			g.m = rem[i-1].m // a batch's ranges in one memory: one reference
			continue
		}
		// A memory that cannot be mapped (an old kernel without
		// pidfd_getfd, or a file that is not what the peer says) is
		// copied at its address instead, which the kernel checks
		// against the peer's own memory.
		if m, err := l.mapPeer(g.mem, g.fd, g.off+g.n); err == nil {
			g.m = m
			defer l.unmapPeer(m)
			p.f.shm.Store(true)
		}
	}
	lk := cursor{segs: p.local}
	var liov []unix.Iovec
	var riov []unix.RemoteIovec
	n := 0
	flush := func() error {
		if n == 0 {
			return nil
		}
		err := vmCopy(p, l.pid, liov, riov, n, write)
		liov, riov, n = liov[:0], riov[:0], 0
		return err
	}
	for _, g := range rem {
		if g.m != nil { // the process_vm copies before it go first
			if err := flush(); err != nil {
				return err
			}
		}
		for done := uint64(0); done < g.n; {
			if g.m == nil && (n >= cmaChunk || len(liov) >= iovMax) {
				if err := flush(); err != nil {
					return err
				}
			}
			want := min(g.n-done, cmaChunk)
			if g.m == nil {
				want = min(want, uint64(cmaChunk-n))
			}
			s := lk.next(int(want)).b // host memory: oneSided saw to it
			if len(s) == 0 {
				return fmt.Errorf("the local ranges end before the grant's %d bytes", p.total)
			}
			if g.m != nil {
				at := g.off + done
				if at+uint64(len(s)) > uint64(len(g.m.b)) { // checked where the range was granted: never
					return fmt.Errorf("a range of %d bytes at %d past the peer's %d-byte mapping", len(s), at, len(g.m.b))
				}
				if err := shmCopy(&p.mu, &p.active, s, g.m.b[at:at+uint64(len(s))], write); err != nil {
					return err
				}
			} else {
				v := unix.Iovec{Base: unsafe.SliceData(s)}
				v.SetLen(len(s))
				liov = append(liov, v)
				riov = append(riov, unix.RemoteIovec{Base: uintptr(g.addr + done), Len: len(s)})
				n += len(s)
			}
			done += uint64(len(s))
		}
	}
	return flush()
}

// vmCopy moves n bytes between liov (here) and riov (in pid) under p's
// lock, while p is active, retrying after short copies. It marks p as
// copying first (see part.copying), and copies nothing once p is ending.
// A copy of at least 2*cmaPieceMin bytes is cut into pieces, copied at
// once by as many threads while vmCopy holds the lock on their behalf:
// the system call's cost is pinning the peer's pages, one by one, in the
// calling thread, and more threads share it out. The process's copies
// together use at most cmaCopiers() threads for that (vmThreads): where
// as many copies run at once already, each keeps to its own.
func vmCopy(p *part, pid int, liov []unix.Iovec, riov []unix.RemoteIovec, n int, write bool) error {
	p.copying.Add(1)
	defer p.copying.Add(-1)
	if p.ending.Load() {
		return nil // as for a part no longer active: its finisher reports
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.active {
		return nil
	}
	k := takeThreads(n / cmaPieceMin)
	defer vmThreads.Add(-int32(k))
	if testHookVMPieces != nil {
		testHookVMPieces(k)
	}
	if k < 2 {
		return vmCopyRun(pid, liov, riov, n, write)
	}
	// Every piece is cut before any thread starts, so that nothing past
	// this point can leave a piece copying once the lock is let go.
	type piece struct {
		l []unix.Iovec
		r []unix.RemoteIovec
		n int
	}
	pieces := make([]piece, k)
	for i := range pieces {
		lo, hi := inter.Stripe(n, k, i)
		pl, pr := iovRange(liov, riov, lo, hi)
		pieces[i] = piece{pl, pr, hi - lo}
	}
	var wg sync.WaitGroup
	errs := make([]error, k)
	for i, pc := range pieces[:k-1] {
		wg.Go(func() { errs[i] = vmCopyRun(pid, pc.l, pc.r, pc.n, write) })
	}
	last := pieces[k-1] // the last piece is this goroutine's
	errs[k-1] = vmCopyRun(pid, last.l, last.r, last.n, write)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// cmaPieceMin is about the least bytes one thread of a vmCopy copies
// (a piece may be a few bytes short): below it, handing a piece to
// another thread costs more than it saves.
const cmaPieceMin = 1 << 20

// vmThreads counts the threads of this process in vmCopy's system calls.
var vmThreads atomic.Int32

// takeThreads counts, in vmThreads, the threads a copy of up to want
// pieces copies with, and returns how many: its own, and more only while
// the process's copies together stay within cmaCopiers().
func takeThreads(want int) int {
	for {
		busy := vmThreads.Load()
		k := max(1, min(cmaCopiers()-int(busy), want))
		if vmThreads.CompareAndSwap(busy, busy+int32(k)) {
			return k
		}
	}
}

// testHookVMPieces, when set (tests only), is told the threads each
// vmCopy copies with.
var testHookVMPieces func(k int)

// cmaCopiers is the most threads one vmCopy copies with: the processors
// Go runs on, at most four.
func cmaCopiers() int { return min(runtime.GOMAXPROCS(0), 4) }

// vmCopyRun is one thread's process_vm copy of n bytes, retried after
// short copies.
func vmCopyRun(pid int, liov []unix.Iovec, riov []unix.RemoteIovec, n int, write bool) error {
	for n > 0 {
		var m int
		var err error
		if write {
			m, err = unix.ProcessVMWritev(pid, liov, riov, 0)
		} else {
			m, err = unix.ProcessVMReadv(pid, liov, riov, 0)
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if m <= 0 {
			return fmt.Errorf("process_vm copied nothing")
		}
		n -= m
		liov, riov = advance(liov, riov, m)
	}
	return nil
}

// iovRange returns new lists of the bytes lo to hi of liov and riov
// (which describe equal pieces, range by range).
func iovRange(liov []unix.Iovec, riov []unix.RemoteIovec, lo, hi int) ([]unix.Iovec, []unix.RemoteIovec) {
	var pl []unix.Iovec
	var pr []unix.RemoteIovec
	at := 0
	for i := range riov {
		a, b := max(at, lo), min(at+riov[i].Len, hi)
		if a < b {
			l := unix.Iovec{Base: (*byte)(unsafe.Add(unsafe.Pointer(liov[i].Base), a-at))}
			l.SetLen(b - a)
			pl = append(pl, l)
			pr = append(pr, unix.RemoteIovec{Base: riov[i].Base + uintptr(a-at), Len: b - a})
		}
		at += riov[i].Len
		if at >= hi {
			break
		}
	}
	return pl, pr
}

// advance drops the first m bytes of both iovec lists (which describe
// equal pieces).
func advance(liov []unix.Iovec, riov []unix.RemoteIovec, m int) ([]unix.Iovec, []unix.RemoteIovec) {
	for m > 0 && len(riov) > 0 {
		if m >= riov[0].Len {
			m -= riov[0].Len
			liov, riov = liov[1:], riov[1:]
			continue
		}
		liov[0].Base = (*byte)(unsafe.Add(unsafe.Pointer(liov[0].Base), m))
		liov[0].SetLen(int(liov[0].Len) - m)
		riov[0].Base += uintptr(m)
		riov[0].Len -= m
		m = 0
	}
	return liov, riov
}
