package p2p

import (
	"context"
	"errors"
	"io"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slimego/slimego/inter"
)

// Who reads a connection's socket: its reader goroutine, or a Wait.
//
// A connection's reader goroutine reads every frame the peer sends; a
// Wait whose answer comes on the connection is otherwise told of it by
// that goroutine (an eventfd write, the reader's read that finds the
// socket empty, and the poll that finds the Wait): system calls and a
// hand-over between goroutines that a plain socket's caller, reading its
// own answer, does not make. So a Wait for a small transfer, on a link to
// another process, that finds the socket free, between frames, takes it
// (sock.own) and reads and handles the frames that come itself, on its
// own thread, waiting for them in ppoll(2) on the socket and its waker,
// until its Future is done; then it gives the socket back.
//
// The ppoll holds the thread's processor (P) while it waits, where a
// parked goroutine would give it up: where no other processor is idle,
// goroutines of this process that the answer needs (a peer endpoint in
// the same process, a send's writer) wait for the runtime's monitor to
// take it. So the wait is bounded by a budget that adapts as
// inter.Reader's polling does (spin): reset when the answer came within
// it, halved when it ran out; then the Wait gives the socket back and
// parks on the waker as a larger transfer's does.
//
// A Wait handles only frames whole in the buffer, of at most AheadMax
// bytes with what follows them (peek), and only of the kinds its answer
// comes in (waitable), so that it never waits inside a frame, where it
// could not see its context end, never reads a large transfer's bytes,
// and never does the reader's other work (the peer's requests, grants):
// such a frame, and the socket, go to the reader goroutine (handOff),
// woken by a read deadline in the past.
//
// The reader goroutine, between frames, does not park in a read (which
// would take the bytes) but in RawConn.Read with a callback (takeTurn)
// that takes the socket, then reads it; while a Wait holds the socket the
// callback counts the wake-up (missed) and parks again. A Wait that gives
// the socket back looks at that count, and if it moved reads once more,
// handing what it finds to the reader.
//
// Go's netpoller lets one goroutine wait on a socket's reads at a time
// (RawConn.Read holds the socket's read lock while it waits), so a Wait
// reads with read(2) and waits in ppoll(2). The socket's descriptor must
// then stay open while a Wait holds it: fail, finding a Wait there, shuts
// the socket down (which wakes the Wait's ppoll and tells the peer) and
// leaves the close to the Wait, which closes it as it gives the socket
// back (free); the link's end does the same with the waker's
// descriptor.
const (
	ownFree   int32 = iota // between frames, nobody reads
	ownReader              // the reader goroutine reads (a frame, or ones buffered)
	ownWait                // a Wait reads
)

// ownBuf bounds the bytes a Wait buffers: a whole small frame with what
// follows it (a read's answer and its data frame).
const ownBuf = inter.AheadMax + 4*HeaderSize

// sock is a connection's state of who reads its socket.
type sock struct {
	own    atomic.Int32
	missed atomic.Uint32 // the reader's wake-ups while a Wait held the socket
	// frames counts the frames read and handled, and a Wait's reads that
	// brought bytes: the heartbeat's progress, which the reader goroutine
	// checks when its wait times out.
	frames atomic.Uint64
	// ended: a read of the socket failed (its end, an error): whoever
	// read it handled it, and no one reads the socket again.
	ended atomic.Bool
	// closing: the link failed; the socket is closed by fail, or, if a
	// Wait held it then, by that Wait as it gives it back (sockOnce).
	closing  atomic.Bool
	sockOnce sync.Once
	// wakerEnd: the link has ended; the waker is closed likewise.
	wakerEnd  atomic.Bool
	wakerOnce sync.Once
	turnFn    func(fd uintptr) bool // takeTurn, made once
	turnErr   error                 // takeTurn's read's error

	// The state of the Wait that holds the waker (busy), which a Wait
	// holds before it takes the socket, and until it returns.
	pset [2]unix.PollFd // the poll set: socket, waker
	spin time.Duration  // the budget of a wait in ppoll (adapt)

	// waitFrames counts the frames Waits handled, handed their
	// hand-overs (tests see the path taken).
	waitFrames atomic.Uint64
	handed     atomic.Uint64
}

// waitReadsSelf lets Waits read their answers on links to peers in this
// process too (tests: both endpoints of a pair are in the test's
// process).
var waitReadsSelf bool

// testHookRelease, when set (by tests), runs as a Wait that found the
// socket empty is about to give it back.
var testHookRelease func(*conn)

// errConnEnded is what a reader finds when another already handled the
// socket's end.
var errConnEnded = errors.New("p2p: the connection's reads ended")

// turn returns once the reader goroutine holds the socket with bytes to
// read (buffered, or read by takeTurn), or with the error a read met. It
// waits in the netpoller, by the heartbeat deadline, which frames handled
// by a Wait meanwhile push back.
func (c *conn) turn() error {
	if c.own.Load() == ownReader {
		return nil // kept: bytes of the next frame are buffered
	}
	seen := c.frames.Load()
	for {
		d := time.Now().Add(c.l.hb)
		c.c.SetReadDeadline(d)
		c.turnErr = nil
		err := c.rc.Read(c.turnFn)
		if err == nil {
			return c.turnErr
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if time.Now().Before(d) {
				// A Wait's kick (handOff): a deadline in the past, set
				// over this one. It may come after the bytes it was for
				// were read (by this reader, woken by their arrival, or
				// by another Wait): this deadline, set again, is what
				// counts.
				continue
			}
			if n := c.frames.Load(); n != seen {
				seen = n // a Wait handled frames meanwhile: the link lives
				continue
			}
		}
		return err
	}
}

// takeTurn is turn's RawConn callback: it takes the socket if it is free
// and reads what is there; it gives it back and parks (false) when
// nothing is. While a Wait holds the socket it counts the wake-up and
// parks: the Wait reads the bytes, or finds the count moved when it
// gives the socket back and reads them then.
func (c *conn) takeTurn(fd uintptr) bool {
	if !c.own.CompareAndSwap(ownFree, ownReader) {
		c.missed.Add(1)
		// Counted before this second look: a Wait that gave the socket
		// back after the first finds the count moved, or this takes it.
		if !c.own.CompareAndSwap(ownFree, ownReader) {
			return false
		}
	}
	if c.ended.Load() {
		c.turnErr = errConnEnded
		return true
	}
	if c.rd.Buffered() > 0 {
		return true
	}
	upto := HeaderSize // a large frame's payload is read into its buffer
	if c.ahead {
		upto += inter.AheadMax
	}
	for {
		n, err := c.rd.Fill(fd, upto)
		switch {
		case n > 0:
			return true
		case err == nil:
			c.turnErr = io.EOF
			return true
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			c.own.Store(ownFree)
			return false
		default:
			c.turnErr = err
			return true
		}
	}
}

// readErr handles err, met reading the connection, once per connection:
// the peer's end of this connection, met reading a frame's header
// (atHeader; connEnded: the link lives on for a while), else the link's
// failure.
func (c *conn) readErr(err error, atHeader bool) {
	if !c.ended.CompareAndSwap(false, true) {
		return
	}
	if atHeader && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)) && c.l.connEnded(c.classify(err, "receiving")) {
		return // the other connections read on: connEnded fails the link
	}
	c.l.fail(c.classify(err, "receiving"))
}

// shut is fail's close of the connection's socket: now, or, if a Wait
// holds it, once that Wait gives it back (the socket is shut down first,
// which wakes the Wait and tells the peer).
func (c *conn) shut() {
	c.closing.Store(true)
	if c.own.Load() != ownWait {
		c.closeSock()
		return
	}
	c.rc.Control(func(fd uintptr) { unix.Shutdown(int(fd), unix.SHUT_RDWR) })
}

// endWaker is the link's end's close of the connection's waker: now, or
// once the Wait that holds the socket (and polls the waker) gives it
// back.
func (c *conn) endWaker() {
	c.wakerEnd.Store(true)
	if c.own.Load() != ownWait {
		c.wakerOnce.Do(c.waker.close)
	}
}

// closeSock closes the socket, once (fail's shut, or the Wait that held
// it then).
func (c *conn) closeSock() { c.sockOnce.Do(func() { c.c.Close() }) }

// free gives the socket back and closes what fail or the link's end left
// to the Wait that held it.
func (c *conn) free() {
	c.own.Store(ownFree)
	if c.closing.Load() {
		c.closeSock()
	}
	if c.wakerEnd.Load() {
		c.wakerOnce.Do(c.waker.close)
	}
}

// release gives the socket back, buffering nothing. If the reader
// goroutine parked on bytes meanwhile (missed moved since seen), it takes
// the socket again if it is still free and reads once: what it finds goes
// to the reader (handOff); the socket's end or an error is handled.
func (c *conn) release(seen uint32) {
	if testHookRelease != nil {
		testHookRelease(c)
	}
	if c.rd.Buffered() > 0 && !c.closing.Load() && !c.ended.Load() {
		c.handOff() // bytes left buffered (a Wait whose context ended as it took the socket)
		return
	}
	for {
		c.free()
		if c.missed.Load() == seen || c.closing.Load() || c.ended.Load() || !c.own.CompareAndSwap(ownFree, ownWait) {
			return
		}
		seen = c.missed.Load()
		if c.closing.Load() || c.ended.Load() {
			continue // fail may have closed the socket before the take
		}
		n, err := c.rd.Fill(uintptr(c.rd.FD()), ownBuf)
		switch {
		case n > 0:
			c.frames.Add(1) // bytes came: the link lives (turn)
			c.handOff()
			return
		case err == unix.EAGAIN, err == unix.EINTR:
		case err == nil:
			c.readErr(io.EOF, true)
		default:
			c.readErr(err, true)
		}
	}
}

// handOff gives the socket, with the bytes buffered, to the reader
// goroutine, and wakes it with a read deadline in the past, set while
// the socket is still held, so that the reader is not inside a frame's
// reads, which the deadline would fail. A reader that re-armed its
// deadline over it and parked before the socket was free counts a
// missed wake-up: then the kick is made again.
func (c *conn) handOff() {
	c.handed.Add(1)
	for {
		seen := c.missed.Load()
		c.c.SetReadDeadline(time.Unix(1, 0))
		c.free()
		if c.missed.Load() == seen || c.closing.Load() || c.ended.Load() || !c.own.CompareAndSwap(ownFree, ownWait) {
			return
		}
		if c.closing.Load() || c.ended.Load() {
			c.free()
			return
		}
	}
}

// peek judges the buffered bytes: whole, a frame whole in the buffer
// with every frame its handling reads (a read's answer and its data
// frames), which the Wait may handle without waiting; bulk, a frame that
// brings more than AheadMax bytes, one that does not fit the Wait's
// buffer, or one a Wait does not handle (waitable), which it leaves to
// the reader goroutine. Neither: the frame is
// not all there yet. Bytes that do not decode are whole: handling them
// fails the link, as the reader would.
func (c *conn) peek() (whole, bulk bool) {
	b := c.rd.Peek()
	if len(b) < HeaderSize {
		return false, false
	}
	h, err := decodeHeader(b[:HeaderSize])
	if err != nil {
		return true, false
	}
	if !waitable(h) {
		return false, true
	}
	var follow uint64
	switch {
	case h.kind == kResp && h.sub == rRead && h.status == stOK,
		h.kind == kReq && h.sub == rSend && h.status == stOK:
		follow = h.a
	}
	if uint64(h.payload)+follow > inter.AheadMax {
		return false, true
	}
	off := HeaderSize + int(h.payload)
	for got := uint64(0); got < follow; {
		if len(b) < off+HeaderSize {
			return false, off+HeaderSize > ownBuf
		}
		d, err := decodeHeader(b[off : off+HeaderSize])
		if err != nil || d.id != h.id || (d.kind != kData && d.kind != kEnd) {
			return true, false
		}
		off += HeaderSize + int(d.payload)
		if d.kind == kEnd {
			break
		}
		got += uint64(d.payload)
	}
	if len(b) < off {
		return false, off > ownBuf
	}
	return true, false
}

// waitable reports whether a Wait may handle frame h: a ping, an answer
// over TCP, a send's clear or its bytes: the frames a small transfer's
// answer comes in. The others go to the reader goroutine: the peer's
// requests (whose refusal calls Options.OnRefuse, which runs on a
// connection's goroutine, not a caller's), grants and leases (whose
// copies and mappings the link's end waits for, counting the reader's
// goroutine in), releases, revokes and cancels.
func waitable(h header) bool {
	switch h.kind {
	case kPing:
		return true
	case kResp:
		return h.sub == rRead || h.sub == rWrite || h.sub == rImm || h.sub == rSend
	case kReq:
		return h.sub == rCTS || h.sub == rSend
	}
	return false
}

// frameDirect handles one frame, whole in the buffer (peek), for a Wait
// that holds the socket; an error says whether it was met reading the
// header.
func (c *conn) frameDirect() (err error, atHeader bool) {
	c.rd.Direct = true // the bytes are there: no read waits
	defer func() { c.rd.Direct = false }()
	h, err := c.header()
	if err != nil {
		return err, true
	}
	err = c.dispatch(h)
	c.frames.Add(1)
	c.waitFrames.Add(1)
	return err, false
}

// adapt sets the next hold's budget from this one (see inter.Reader's
// adapt): reset when the answer came within it, halved when it ran out;
// parkRest grows it by a 64th of the most when the wait that followed
// still ended within the most. Below a microsecond it is 0: Waits park
// until a short wait grows it again (Future.Wait).
func (c *conn) adapt(caught bool, waited time.Duration) {
	const most = inter.DefaultPollMax
	if caught {
		c.spin = most
		return
	}
	c.spin /= 2
	if c.spin < time.Microsecond {
		c.spin = 0
	}
}

// readOwn is Wait's way when it took c's socket (ownWait; seen is c's
// missed before it did), with c's waker w held too: it handles the
// connection's frames until f is done (true, nil), or ctx ends or timeout
// passes first (when ctx has no deadline; true and why), then gives the
// socket back. When its budget runs out, or a frame is bulk, it gives the
// socket to the reader goroutine and parks (park). It returns false,
// having read nothing, if the socket may not be read (the link failed),
// and false if the link fails while it reads.
func (f *Future) readOwn(ctx context.Context, c *conn, w *waker, timeout time.Duration, seen uint32) (bool, error) {
	if c.closing.Load() || c.ended.Load() {
		c.release(seen)
		return false, nil
	}
	if err := ctx.Err(); err != nil {
		c.release(seen)
		return true, err
	}
	start := time.Now()
	dl, ok := ctx.Deadline()
	if !ok {
		dl = start.Add(timeout)
	}
	if ctx.Done() != nil {
		w.cancelled.Store(false)
		stop := context.AfterFunc(ctx, w.wakeFn)
		defer stop()
	}
	w.parks.Add(1)
	fd := c.rd.FD()
	yield := false
	// The budget is the whole hold's, from its start.
	until := start.Add(c.spin)
	if dl.Before(until) {
		until = dl
	}
	for !f.fin.Load() && !c.closing.Load() {
		// However busy the socket, the hold ends with ctx, at dl, and
		// when its budget is spent.
		if w.cancelled.Load() {
			if err := ctx.Err(); err != nil {
				c.giveBack(seen)
				return true, err
			}
		}
		if now := time.Now(); !now.Before(until) {
			c.giveBack(seen)
			if !now.Before(dl) {
				return true, context.DeadlineExceeded
			}
			c.adapt(false, time.Since(start))
			return f.parkRest(ctx, c, w, dl, start)
		}
		whole, bulk := c.peek()
		if bulk {
			c.handOff()
			return f.parkRest(ctx, c, w, dl, start)
		}
		if whole {
			if err, atHeader := c.frameDirect(); err != nil {
				c.readErr(err, atHeader)
				c.release(seen)
				return f.fin.Load(), nil
			}
			yield = true
			continue
		}
		n, err := c.rd.Fill(uintptr(fd), ownBuf)
		switch {
		case n > 0:
			// Bytes came: the link lives, though no frame is whole yet
			// (the reader's heartbeat counts frames handled: turn).
			c.frames.Add(1)
			continue
		case err == unix.EINTR:
			continue
		case err == nil:
			err = io.EOF
			if c.rd.Buffered() > 0 {
				err = io.ErrUnexpectedEOF
			}
		}
		if err != unix.EAGAIN {
			// Between frames, or inside a header, the connection's end
			// is handled as the reader's header read would; inside a
			// frame's body, as its dispatch's read would.
			c.readErr(err, c.rd.Buffered() < HeaderSize)
			c.release(seen)
			return f.fin.Load(), nil
		}
		// Nothing more there: wait for the socket, or a wake of the
		// waker (the Future done by another goroutine, ctx cancelled),
		// within the budget.
		f.ev.Store(w)
		if f.fin.Load() {
			f.ev.Store(nil)
			break
		}
		if w.cancelled.Load() {
			w.cancelled.Store(false)
			if err := ctx.Err(); err != nil {
				f.ev.Store(nil)
				c.giveBack(seen)
				return true, err
			}
		}
		if yield {
			// What the frames this Wait handled made runnable (a send's
			// writer, cleared to send) runs first: the poll holds the
			// processor. Not before the first poll: a yield there costs
			// a small read more than it saves (docs/PERFORMANCE.md,
			// 2026-12-07); a request queued for the writer is waited
			// for within the budget, which adapts.
			runtime.Gosched()
			yield = false
		}
		err = inter.PollIn(c.pset[:], fd, w.fd, until)
		f.ev.Store(nil)
		w.wakeups.Add(1)
		if c.pset[1].Revents != 0 {
			var b [8]byte
			unix.Read(w.fd, b[:]) // taken: the next poll waits for the next wake
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if !time.Now().Before(dl) {
				c.giveBack(seen)
				return true, context.DeadlineExceeded
			}
			// The budget ran out: the reader goroutine reads, and this
			// Wait parks (its processor free for others).
			c.adapt(false, time.Since(start))
			c.giveBack(seen)
			return f.parkRest(ctx, c, w, dl, start)
		}
		if err != nil {
			c.readErr(err, c.rd.Buffered() < HeaderSize)
			c.release(seen)
			return f.fin.Load(), nil
		}
	}
	c.giveBack(seen)
	if f.fin.Load() {
		c.adapt(true, time.Since(start)) // caught within the budget
		return true, nil
	}
	return false, nil // the link failed: its Futures fail
}

// giveBack gives the socket back: with the bytes buffered to the reader
// goroutine, else free (release).
func (c *conn) giveBack(seen uint32) {
	if c.rd.Buffered() > 0 {
		c.handOff()
		return
	}
	c.release(seen)
}

// parkRest is the rest of a Wait that gave the socket to the reader
// goroutine: it parks on the waker until dl, and adapts the budget to
// how long the whole wait took.
func (f *Future) parkRest(ctx context.Context, c *conn, w *waker, dl, start time.Time) (bool, error) {
	ok, err := f.parkOn(ctx, w, dl)
	if c.spin < inter.DefaultPollMax && time.Since(start) <= inter.DefaultPollMax {
		c.spin += inter.DefaultPollMax / 64 // a little more budget might have caught it
	}
	return ok, err
}
