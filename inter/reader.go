package inter

import (
	"io"
	"net"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
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
	fd    int // the socket, for setsockopt; valid while c is open
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
}

// DefaultPollMax bounds a receive's polling (Config.PollMax). A wait for
// a peer that runs and answers at once lasts a round trip or less; one
// that lasts longer waits for a peer that is busy elsewhere, and polling
// through it only takes processor time from the rest of the machine.
const DefaultPollMax = 100 * time.Microsecond

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
func (r *Reader) SetLowat(n int) {
	if r.Lowat <= 0 || r.fd < 0 {
		return
	}
	n = max(min(n, r.Lowat), 1)
	if n != r.cur {
		unix.SetsockoptInt(r.fd, unix.SOL_SOCKET, unix.SO_RCVLOWAT, n)
		r.cur = n
	}
}

// lowatMin is the least that is worth a low-water mark: below it a read
// takes what is there, so that small messages pay no setsockopt (one
// costs about as much as the wake-ups it would save).
const lowatMin = 256 << 10

// ReadFull reads len(buf) bytes (io.ErrUnexpectedEOF if the stream ends
// first). It allocates nothing. With Poll set, each read of less than
// lowatMin polls first (see Reader); every wait ends by the deadline.
func (r *Reader) ReadFull(buf []byte) error {
	for len(buf) > 0 {
		var n int
		var err error
		if len(buf) >= lowatMin {
			r.SetLowat(len(buf))
			r.arm()
			n, err = r.c.Read(buf)
		} else {
			r.SetLowat(1)
			if r.Poll && r.pollFn != nil {
				n, err = r.readPolled(buf)
			} else {
				r.arm()
				n, err = r.c.Read(buf)
			}
		}
		buf = buf[n:]
		if err != nil {
			if err == io.EOF && len(buf) > 0 {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
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

// adapt sets the next polling budget from the wait just done (additive
// increase, multiplicative decrease). Bytes caught while polling, w after
// the read began, keep a budget of at least 2w. A budget that ran out
// halves: the peer was busy, or needed this very processor, which polling
// kept from it (when another process holds the other core, the two ranks
// of a pair take turns on one). A wait that parked and still ended within
// PollMax might have been caught by a little more polling, so the budget
// grows by PollMax/64. Where the peer shares this processor the budget
// thus settles near PollMax/32, a few microseconds lost per wait; where
// the peer answers from a core of its own, a few such waits grow it until
// polling catches the answer; where the waits are long it falls to
// nothing, and the reads park at once.
func (r *Reader) adapt(parked bool, waited time.Duration) {
	if !parked {
		r.spin = min(r.PollMax, max(r.spin, 2*waited))
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

// rawRead is read(2) on a non-blocking socket, which returns at once, so
// without the runtime's system-call bookkeeping (entersyscall and
// exitsyscall, and the monitor's hand-off of a processor that a system
// call holds), which a tight loop of them would pay on every try.
func rawRead(fd int, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}
