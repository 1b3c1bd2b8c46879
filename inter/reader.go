package inter

import (
	"io"
	"net"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/slimego/slimego/internal/raceio"
)

// Reader reads whole blocks from a TCP connection, waking once per Lowat
// bytes instead of once per arriving segment: before each read it sets the
// socket's low-water mark (SO_RCVLOWAT) to the smaller of Lowat and what is
// left of the block, so that the kernel neither wakes the reader for every
// 64 KiB nor waits for bytes that will not come. On a link whose bandwidth
// is bounded by the CPU (the kernel's copies), the wake-ups saved are
// bandwidth gained. A Lowat of 0 or less reads as io.ReadFull does. (The
// kernel caps the mark at half the receive buffer, or, where autotuning
// sizes that buffer, at half the largest it may grow to, and grows it to
// fit.)
//
// With Poll set, reads of less than lowatMin first poll the socket without
// blocking, for up to an adaptive budget of at most PollMax, before they
// park in Go's netpoller, as OpenMPI's TCP transport and NCCL's socket
// transport poll: a receive that expects its bytes within microseconds
// catches them on a running processor instead of paying for the
// netpoller's wake-up of an idle one (on a virtual machine, a halted
// virtual CPU's). While a polling Reader does not park, the socket has no
// read deadline: a pending deadline is a runtime timer, and while one is
// pending an idle processor of the process waits in the netpoller's
// epoll_wait, which every arriving segment then wakes for nothing, on a
// core the peer may need. The polling loop checks the deadline itself and
// sets it on the socket only to park.
type Reader struct {
	c     *net.TCPConn
	fd    int // the socket when made (-1: none); SetLowat reaches it through rc
	Lowat int
	cur   int // the low-water mark set now
	// Poll makes small reads poll before they park (see Reader); set it
	// before SetDeadline.
	Poll bool
	// PollMax bounds a read's polling (0: never polls).
	PollMax time.Duration

	deadline time.Time // every read ends by it (SetDeadline)
	managed  bool      // SetDeadline was called: the Reader owns the socket's read deadline
	armed    bool      // the socket's read deadline is set to deadline

	rc     syscall.RawConn       // made once; nil where c gives none
	pollFn func(fd uintptr) bool // r.poll, bound once so that a read allocates nothing
	spin   time.Duration         // the polling budget now (see adapt)
	pbuf   []byte                // poll's destination
	pn     int                   // what poll read
	perr   error                 // poll's error (io.EOF at the stream's end)
	until  time.Time             // poll polls until then
	parked bool                  // the read parked in the netpoller

	// ReadAhead's buffer: ahead[alo:ahi] was read off the socket and not
	// yet returned; every read returns it first.
	ahead    []byte
	alo, ahi int

	// SetLowat's RawConn callback and its argument: made for the Reader
	// at lowatOf (the callback refers to it), and made again if it moved.
	lowatFn func(fd uintptr)
	lowatOf *Reader
	lowatN  int

	// ReadFullVec's state for its RawConn callback (vecFn, made once).
	vecFn func(fd uintptr) bool
	vbufs [][]byte
	vn    int
	verr  error

	// Direct makes every read wait for the socket in ppoll(2) on this
	// goroutine's thread, reading it with plain read(2)s, instead of in
	// Go's netpoller, and leaves the socket's read deadline alone (reads
	// end by SetDeadline's time all the same). It is for a goroutine that
	// takes the socket's reads over from another that waits on the same
	// socket in the netpoller (RawConn.Read holds the socket's read lock
	// while it waits, so a read through the net.Conn would wait for that
	// goroutine). Whoever sets it keeps the socket open while it is set.
	Direct bool
	pfd    [1]unix.PollFd // Direct's poll set
}

// vecMax bounds the buffers of one readv(2) (the kernel's UIO_MAXIOV).
const vecMax = 1024

// AheadMax bounds what ReadAhead takes past the bytes asked for: up to it,
// a system call saved is worth more than the copy out of the buffer.
const AheadMax = 4 << 10

// DefaultPollMax bounds a receive's polling (Config.PollMax): how long a
// rank whose peer answers from another core spins for the answer, as
// OpenMPI's and NCCL's socket transports spin, before it gives the
// processor up and parks. Waits longer than that wait for a peer that is
// busy elsewhere (computing, or descheduled), and the budget's decrease
// (see adapt) soon stops such waits from polling at all.
const DefaultPollMax = time.Millisecond

// NewReader reads from c with the given low-water mark bound (0: none).
func NewReader(c *net.TCPConn, lowat int) Reader {
	r := Reader{c: c, fd: -1, Lowat: lowat, cur: 1, PollMax: DefaultPollMax, spin: DefaultPollMax / 2}
	if rc, err := c.SyscallConn(); err == nil {
		r.rc = rc
		rc.Control(func(fd uintptr) { r.fd = int(fd) })
	}
	return r
}

// bind makes the polling callback once, for a Reader at its final address
// (the callback refers to it).
func (r *Reader) bind() { r.pollFn = r.poll }

// SetDeadline makes every read end by d (the zero time: never). Without
// Poll it sets the socket's read deadline; with Poll it clears it, and a
// read sets it only to park. From its first call the Reader owns the
// socket's read deadline; a Reader never given one leaves the socket's
// read deadline to its caller (c.SetReadDeadline), polling or not.
func (r *Reader) SetDeadline(d time.Time) {
	r.deadline, r.managed = d, true
	if r.Direct {
		return
	}
	if r.Poll && r.pollFn != nil {
		r.disarm()
		return
	}
	r.c.SetReadDeadline(d)
	r.armed = true
}

// arm sets the socket's read deadline to r.deadline, disarm clears it.
func (r *Reader) arm() {
	if r.managed && !r.armed {
		r.c.SetReadDeadline(r.deadline)
		r.armed = true
	}
}

func (r *Reader) disarm() {
	if r.armed {
		r.c.SetReadDeadline(time.Time{})
		r.armed = false
	}
}

// SetLowat makes the socket wake its reader once min(n, Lowat) bytes are
// there (at least 1).
//
// The call goes through the RawConn, which holds the descriptor while it
// runs and makes no call once c is closed: a Transport's Interrupt closes
// its sockets while receives are still being collected, and the number
// of a closed socket may by then be another socket's.
func (r *Reader) SetLowat(n int) {
	if r.Lowat <= 0 || r.rc == nil || r.fd < 0 {
		return
	}
	n = max(min(n, r.Lowat), 1)
	if n != r.cur {
		if r.lowatOf != r {
			r.lowatFn, r.lowatOf = r.setLowatFD, r
		}
		r.lowatN = n
		if r.rc.Control(r.lowatFn) == nil {
			r.cur = n
		}
	}
}

// setLowatFD is SetLowat's RawConn callback.
func (r *Reader) setLowatFD(fd uintptr) { setLowat(int(fd), r.lowatN) }

// lowatMin is the least that is worth a low-water mark: below it a read
// takes what is there, so that small messages pay no setsockopt (one
// costs about as much as the wake-ups it would save).
const lowatMin = 256 << 10

// ReadFull reads len(buf) bytes (io.ErrUnexpectedEOF if the stream ends
// first), what an earlier ReadAhead took first. It allocates nothing. With
// Poll set, each read of less than lowatMin polls first (see Reader); every
// wait ends by the deadline.
func (r *Reader) ReadFull(buf []byte) error {
	buf = buf[r.take(buf):]
	for len(buf) > 0 {
		n, err := r.read(buf)
		raceio.Acquire()
		buf = buf[n:]
		if err != nil {
			return eof(err, len(buf))
		}
	}
	return nil
}

// ReadAhead is ReadFull(hdr) that may also take up to more bytes past hdr
// (the rest of a frame whose header hdr is) in the same system calls;
// later reads (ReadFull, Discard) return them first. A small message then
// costs one read, not one for its header and one for its payload. Bytes
// beyond the frame are never lost: they wait in the buffer for the reads
// that want them. With more above AheadMax it reads hdr alone: a large
// payload is read straight into its buffer.
func (r *Reader) ReadAhead(hdr []byte, more int) error {
	hdr = hdr[r.take(hdr):]
	if len(hdr) == 0 {
		return nil
	}
	if more <= 0 || more > AheadMax {
		return r.ReadFull(hdr)
	}
	if len(r.ahead) < len(hdr)+AheadMax {
		r.ahead = make([]byte, len(hdr)+AheadMax) // once per Reader (and header size)
	}
	want := len(hdr) + more
	r.alo, r.ahi = 0, 0 // take left the buffer empty
	for r.ahi < len(hdr) {
		n, err := r.read(r.ahead[r.ahi:want])
		raceio.Acquire()
		r.ahi += n
		if err != nil {
			if r.ahi >= len(hdr) {
				break // the header is whole; the error comes again on the next read
			}
			return eof(err, len(hdr)-r.ahi)
		}
	}
	r.take(hdr)
	return nil
}

// ReadFullVec is ReadFull into the buffers of bufs in order (their slices
// are advanced as they fill; bufs itself is the caller's to reuse): where
// they hold lowatMin bytes or more together, with one readv(2) per
// wake-up across all of them and a low-water mark for their total, so
// that bytes bound for many small buffers (a batch of pages) wake the
// reader once per Lowat bytes, not once per buffer or per segment.
// Smaller reads are ReadFull's, buffer by buffer.
func (r *Reader) ReadFullVec(bufs [][]byte) error {
	total := 0
	for i := range bufs {
		bufs[i] = bufs[i][r.take(bufs[i]):]
		total += len(bufs[i])
	}
	if total < lowatMin || r.rc == nil || r.Direct {
		for _, b := range bufs {
			if err := r.ReadFull(b); err != nil {
				return err
			}
		}
		return nil
	}
	if r.vecFn == nil {
		r.vecFn = r.readVec // once: the callback refers to this Reader
	}
	for total > 0 {
		for len(bufs[0]) == 0 {
			bufs = bufs[1:]
		}
		r.SetLowat(total)
		r.arm()
		r.vbufs, r.vn, r.verr = bufs[:min(len(bufs), vecMax)], 0, nil
		err := r.rc.Read(r.vecFn)
		raceio.Acquire()
		n := r.vn
		r.vbufs = nil
		if err == nil {
			err = r.verr
		}
		total -= n
		for n > 0 {
			k := min(n, len(bufs[0]))
			bufs[0] = bufs[0][k:]
			n -= k
			if len(bufs[0]) == 0 {
				bufs = bufs[1:]
			}
		}
		if err != nil {
			return eof(err, total)
		}
	}
	return nil
}

// readVec is ReadFullVec's RawConn callback: one readv of what is there
// into r.vbufs, or false to wait until the socket is readable (or its
// deadline passes).
func (r *Reader) readVec(fd uintptr) bool {
	for {
		n, err := unix.Readv(int(fd), r.vbufs)
		switch {
		case n > 0:
			r.vn = n
			return true
		case err == nil:
			r.verr = io.EOF
			return true
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return false
		default:
			r.verr = err
			return true
		}
	}
}

// Discard reads n bytes to nowhere (the buffered ones first), parking
// with the socket's deadline set.
func (r *Reader) Discard(n uint64) error {
	k := min(uint64(r.ahi-r.alo), n)
	r.alo += int(k)
	n -= k
	if n == 0 {
		return nil
	}
	r.SetLowat(1)
	if r.Direct {
		if len(r.ahead) == 0 {
			r.ahead = make([]byte, AheadMax) // the buffer is empty: scratch
		}
		for n > 0 {
			k, err := r.readDirect(r.ahead[:min(uint64(len(r.ahead)), n)])
			n -= uint64(k)
			if err != nil {
				return eof(err, int(min(n, 1)))
			}
		}
		return nil
	}
	r.arm() // a polling reader leaves the socket without its deadline
	_, err := io.CopyN(io.Discard, r.c, int64(n))
	return err
}

// Buffered is how many bytes an earlier ReadAhead or Fill took off the
// socket that no read has returned yet.
func (r *Reader) Buffered() int { return r.ahi - r.alo }

// FD is the socket's descriptor (-1 if c gave none); it is valid while c
// is open.
func (r *Reader) FD() int { return r.fd }

// Fill is a read that a caller that holds the socket makes itself (a
// RawConn callback, or a Direct reader between frames): one non-blocking
// read that adds what is there to the buffered bytes, until they are upto
// in all (the buffer grows to upto, once), for the next reads to take. It
// returns what read(2) did: unix.EAGAIN when nothing is there; 0 and nil
// at the stream's end, or when upto bytes are buffered already.
func (r *Reader) Fill(fd uintptr, upto int) (int, error) {
	if len(r.ahead) < upto {
		a := make([]byte, upto)
		r.ahi = copy(a, r.ahead[r.alo:r.ahi])
		r.ahead, r.alo = a, 0
	} else if r.alo > 0 {
		r.ahi = copy(r.ahead, r.ahead[r.alo:r.ahi])
		r.alo = 0
	}
	if r.ahi >= upto {
		return 0, nil
	}
	n, err := rawRead(int(fd), r.ahead[r.ahi:upto])
	if n > 0 {
		r.ahi += n
		raceio.Acquire()
	}
	return max(n, 0), err
}

// Peek returns the buffered bytes, which the next reads return first
// (valid until then).
func (r *Reader) Peek() []byte { return r.ahead[r.alo:r.ahi] }

// take copies what ReadAhead buffered into buf, as much as fits, and
// returns how much.
func (r *Reader) take(buf []byte) int {
	if r.alo == r.ahi {
		return 0
	}
	n := copy(buf, r.ahead[r.alo:r.ahi])
	r.alo += n
	return n
}

// read is one read into buf: with a low-water mark for a large one,
// polled first for a small one where Poll is set.
func (r *Reader) read(buf []byte) (int, error) {
	if len(buf) >= lowatMin {
		r.SetLowat(len(buf))
		if r.Direct {
			return r.readDirect(buf)
		}
		r.arm()
		return r.c.Read(buf)
	}
	r.SetLowat(1)
	if r.Direct {
		return r.readDirect(buf)
	}
	if r.Poll && r.pollFn != nil {
		return r.readPolled(buf)
	}
	r.arm()
	return r.c.Read(buf)
}

// readDirect is one read for a Direct Reader: read(2) on the socket,
// and while it finds nothing, ppoll(2) for it until the deadline
// (os.ErrDeadlineExceeded then).
func (r *Reader) readDirect(buf []byte) (int, error) {
	for {
		n, err := rawRead(r.fd, buf)
		switch {
		case n > 0:
			return n, nil
		case err == nil:
			return 0, io.EOF
		case err == unix.EINTR:
			continue
		case err != unix.EAGAIN:
			return 0, err
		}
		if err := PollIn(r.pfd[:], r.fd, -1, r.deadline); err != nil {
			return 0, err
		}
	}
}

// PollIn waits in ppoll(2), on this goroutine's thread, until fd (or
// also fd2, if not -1) is readable, or deadline passes
// (os.ErrDeadlineExceeded; the zero time: never). set is the poll set to
// use, of one entry, or two with fd2. It reports which was readable
// through set's Revents.
func PollIn(set []unix.PollFd, fd, fd2 int, deadline time.Time) error {
	set[0] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
	if fd2 >= 0 {
		set[1] = unix.PollFd{Fd: int32(fd2), Events: unix.POLLIN}
	} else {
		set = set[:1]
	}
	for {
		var ts *unix.Timespec
		var t unix.Timespec
		if !deadline.IsZero() {
			left := time.Until(deadline)
			if left <= 0 {
				return os.ErrDeadlineExceeded
			}
			t = unix.NsecToTimespec(int64(left))
			ts = &t
		}
		n, err := unix.Ppoll(set, ts, nil)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return err
		case n > 0:
			return nil
		}
	}
}

// eof turns an end of stream with left bytes still wanted into
// io.ErrUnexpectedEOF.
func eof(err error, left int) error {
	if err == io.EOF && left > 0 {
		return io.ErrUnexpectedEOF
	}
	return err
}

// readPolled is one read that polls for up to the budget (or the deadline,
// if that comes first) before it parks, then adapts the budget to how the
// wait went.
func (r *Reader) readPolled(buf []byte) (int, error) {
	t0 := time.Now()
	r.until = t0.Add(r.spin)
	if !r.deadline.IsZero() && r.deadline.Before(r.until) {
		r.until = r.deadline
	}
	r.pbuf, r.pn, r.perr, r.parked = buf, 0, nil, false
	err := r.rc.Read(r.pollFn)
	n, perr, parked := r.pn, r.perr, r.parked
	r.pbuf, r.perr = nil, nil
	r.disarm()
	r.adapt(parked, time.Since(t0))
	if err == nil {
		err = perr
	}
	return n, err
}

// poll is the RawConn callback: it reads what is there without blocking
// (Go keeps its sockets non-blocking), trying again until r.until while
// nothing is. Then (and at every call after a park) it tries once more,
// sets the socket's deadline, and returns false to park in the netpoller,
// which ends the wait at the deadline.
func (r *Reader) poll(fd uintptr) bool {
	for {
		n, err := rawRead(int(fd), r.pbuf)
		switch {
		case n > 0:
			r.pn = n
			return true
		case err == nil:
			r.perr = io.EOF
			return true
		case err == unix.EINTR:
			continue
		case err != unix.EAGAIN:
			r.perr = err
			return true
		}
		if !time.Now().Before(r.until) {
			r.arm()
			r.parked = true
			return false
		}
	}
}

// adapt sets the next polling budget from the wait just done: it resets
// on success, and decreases multiplicatively with an additive increase.
// A read that did not park (its bytes were caught while polling, or were
// there at the first look) puts the budget back to PollMax: the peer
// answers while this rank polls, and polling is then the fastest way to
// wait, as OpenMPI's TCP transport, which polls without end where ranks
// do not outnumber cores. Resetting only on bytes caught after a miss
// left both ranks of a pair parked for good once their budgets had fallen
// below the other's wake-up time: every answer then came after a park,
// and none was ever caught. A budget that ran out halves: the peer was
// busy, or needed this very processor, which polling kept from it (when
// another process holds the other core, the two ranks of a pair take
// turns on one). A wait that parked and still ended within PollMax might
// have been caught by a little more polling, so the budget grows by
// PollMax/64. Where the waits are long the budget falls to nothing, and
// the reads park at once until one finds its bytes there.
func (r *Reader) adapt(parked bool, waited time.Duration) {
	if !parked {
		r.spin = r.PollMax
		return
	}
	r.spin /= 2
	if waited <= r.PollMax {
		r.spin += r.PollMax / 64
	}
	r.spin = min(r.spin, r.PollMax)
	if r.spin < time.Microsecond {
		r.spin = 0
	}
}

// setLowat is setsockopt(SO_RCVLOWAT), which returns at once, made without
// the runtime's system-call entry (which wakes the runtime's monitor
// thread whenever it sleeps, as it does while the process waits).
func setLowat(fd, n int) {
	v := int32(n)
	unix.RawSyscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_RCVLOWAT, uintptr(unsafe.Pointer(&v)), 4, 0)
}
