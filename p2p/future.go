package p2p

import (
	"context"
	"errors"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/slimego/slimego/inter"
)

// Future is the result of one call (a batched Read or Write, an
// immediate, a Send or a Recv), which may have been split into parts over
// several connections.
type Future struct {
	op, peer  string
	region    string // the remote region a one-sided batch names, if one, for errors (label)
	transport string
	shm       atomic.Bool // a part copied through a mapping of the peer's Shared memory
	tcp       atomic.Bool // a same-host part went over TCP after all (conn.overTCP): set while it runs, and Transport may be read meanwhile, so not in transport
	done      chan struct{}
	left      atomic.Int32
	mu        sync.Mutex
	err       error
	parts     []*part
	n         atomic.Int64 // Recv: the message's length, set when matched (Len may be read meanwhile)
	// WriteWithImm: the immediate's part, sent when writesLeft parts have
	// succeeded.
	then       *part
	writesLeft atomic.Int32
	// fin is set once done is closed; ev is the waker a Wait parks on
	// (park), which whoever closes done then wakes.
	fin atomic.Bool
	ev  atomic.Pointer[waker]
	// one is the storage of a one-sided call's first part and of the
	// first elements of its slices, so that a batch of one operation in
	// one request (the common small call) allocates the Future alone
	// (Peer.oneSided).
	one struct {
		part  part
		parts [1]*part
		descs [1]desc
		local [1]seg
		regs  [1]*Region
	}
}

func newFuture(op, peer, transport string) *Future {
	return &Future{op: op, peer: peer, transport: transport, done: make(chan struct{})}
}

// label is the remote region f names, quoted, as errors name it ("" for
// none). It is quoted here, when an error is made, not for every call.
func (f *Future) label() string {
	if f.region == "" {
		return ""
	}
	return strconv.Quote(f.region)
}

// failed returns a Future that is already done with err.
func failed(op, peer string, err error) *Future {
	f := newFuture(op, peer, "")
	f.err = asOp(op, peer, err)
	close(f.done)
	return f
}

// named is err as f's failure: an *OpError of f's operation (asOp) that
// names f's remote region where err names none (the link's failure, a
// wait cut short), so that every error of a call says what it was moving.
func (f *Future) named(err error) error {
	err = asOp(f.op, f.peer, err)
	if oe, ok := err.(*OpError); ok && oe.Region == "" && f.region != "" {
		c := *oe // the link's error is every transfer's: not changed in place
		c.Region = f.label()
		return &c
	}
	return err
}

func (f *Future) partDone(err error) {
	if err != nil {
		f.mu.Lock()
		if f.err == nil {
			f.err = f.named(err)
		}
		parts := f.parts
		f.mu.Unlock()
		// One part failed: the call has, so the others stop too.
		for _, p := range parts {
			p.finish(err)
		}
	}
	if f.left.Add(-1) == 0 {
		close(f.done)
		f.fin.Store(true)
		if w := f.ev.Load(); w != nil {
			w.wake()
		}
	}
}

// Wait returns when the transfer is done: nil once every byte is in place
// (a Write's bytes in the peer's region, a Read's in this side's), or the
// first error. If ctx ends first (or Options.Timeout passes, when ctx has
// no deadline), the transfer is cancelled and Wait returns ErrCancelled or
// ErrTimeout; once it has returned nothing of the transfer touches this
// side's memory any more (a late answer is dropped), so the buffers may be
// reused at once. A Write's bytes in the peer's region are then undefined.
// The one exception: a same-host copy that the peer's memory holds up in
// the kernel (its pages do not come: a userfaultfd's, a file's on a hung
// file system) cannot be stopped; Wait then returns ErrCancelled or
// ErrTimeout saying so, stallGrace after ctx ended, and the Future is not
// done: its local memory may still be written until Done is closed.
func (f *Future) Wait(ctx context.Context) error {
	if f == nil {
		return opErr("wait", "", "", ErrInvalid, "a nil Future")
	}
	if f.done == nil {
		// A zero Future (new(Future)): no call made it, nothing to wait for.
		return opErr("wait", "", "", ErrInvalid, "a zero Future (not returned by a call)")
	}
	select {
	case <-f.done:
		return f.result()
	default:
	}
	if len(f.parts) == 0 {
		select {
		case <-f.done:
		case <-ctx.Done():
			return f.end(ctx.Err())
		}
		return f.result()
	}
	l := f.parts[0].l
	if ch := f.parts[0].ch; ch < len(l.conns) {
		c := l.conns[ch]
		if w := c.waker; w != nil && w.busy.CompareAndSwap(false, true) {
			var ok bool
			var ended error
			seen := c.missed.Load() // before the take: a wake-up missed after it counts
			if p := f.parts[0]; l.waitReads && len(f.parts) == 1 && (p.kind == rCTS || p.total <= inter.AheadMax) && c.spin > 0 && c.own.CompareAndSwap(ownFree, ownWait) {
				// A small transfer, and the socket is between frames:
				// this Wait reads its answer itself (own_linux.go). A
				// large one's same-host copy would be made by the Wait
				// itself, which a cancel could not then cut short, and
				// its bytes handed over (handOff). A receive's total
				// changes when it is matched (its bytes come as a send,
				// handed over where large: peek).
				ok, ended = f.readOwn(ctx, c, w, l.e.opts.Timeout, seen)
			} else {
				w.parks.Add(1)
				start := time.Now()
				ok, ended = f.park(ctx, w, l.e.opts.Timeout)
				if c.spin == 0 && time.Since(start) <= inter.DefaultPollMax {
					// The Wait's budget had run out (see readOwn): a
					// short wait grows it, so that a Wait tries again.
					c.spin = inter.DefaultPollMax / 64
				}
			}
			w.busy.Store(false)
			if ok {
				if ended != nil {
					return f.end(ended)
				}
				return f.result()
			}
			// The waker failed (its link ended): wait on the channel.
		}
	}
	ctx, cancel := l.e.bound(ctx)
	defer cancel()
	select {
	case <-f.done:
	case <-ctx.Done():
		return f.end(ctx.Err())
	}
	return f.result()
}

// park waits for f on w, which the caller holds, until f is done (true,
// nil), or ctx ends or timeout passes first (when ctx has no deadline):
// then it returns true and why (ctx's error; context.DeadlineExceeded for
// the timeout). It returns false, f not done, if w fails (closed with its
// link).
func (f *Future) park(ctx context.Context, w *waker, timeout time.Duration) (bool, error) {
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(timeout)
	}
	if ctx.Done() != nil { // it can be cancelled
		w.cancelled.Store(false) // an earlier holder's, if its AfterFunc ran late
		stop := context.AfterFunc(ctx, w.wakeFn)
		defer stop()
	}
	return f.parkOn(ctx, w, dl)
}

// parkOn is park once ctx's cancel wakes w (or ctx cannot be
// cancelled), until dl.
func (f *Future) parkOn(ctx context.Context, w *waker, dl time.Time) (bool, error) {
	if err := ctx.Err(); err != nil {
		return true, err
	}
	w.f.SetReadDeadline(dl)
	f.ev.Store(w)
	defer f.ev.Store(nil)
	for !f.fin.Load() {
		err := w.wait(&f.fin)
		switch {
		case f.fin.Load():
		case ctx.Err() != nil:
			return true, ctx.Err()
		case errors.Is(err, os.ErrDeadlineExceeded):
			return true, context.DeadlineExceeded
		case err != nil:
			return false, nil
		case w.cancelled.Load():
			// An earlier holder's cancel, late (its AfterFunc had
			// started when its wait ended): cleared, or wait would not
			// park again. This ctx's own cancel sets Err before it runs
			// wakeFn, so one that comes after the check below sets the
			// flag again, after this clear.
			w.cancelled.Store(false)
			if err := ctx.Err(); err != nil {
				return true, err
			}
		}
	}
	return true, nil
}

// end cancels f, whose wait ended with cause (ctx's error), and returns
// Wait's error once every part is finished, or once stallGrace has passed
// where a part's same-host copy was in the kernel (part.finish) and has
// not returned: then f is not done, and the error says so.
func (f *Future) end(cause error) error {
	sentinel := ErrCancelled
	if cause == context.DeadlineExceeded {
		sentinel = ErrTimeout
	}
	err := opErr(f.op, f.peer, f.label(), sentinel, "the wait ended: %v", cause)
	later := false
	for _, p := range f.parts {
		if p.finish(err) {
			later = true
		}
	}
	if !later {
		<-f.done // every part is finished: this does not block
		return f.result()
	}
	t := time.NewTimer(stallGrace)
	defer t.Stop()
	select {
	case <-f.done:
		return f.result()
	case <-t.C:
		return opErr(f.op, f.peer, f.label(), sentinel, "the wait ended (%v), but a same-host copy is held up in the kernel by the peer's memory (its pages do not come): this side's memory may still be written until the transfer is done (Future.Done)", cause)
	}
}

// stallGrace is how long a Wait whose context ended waits for a
// same-host copy in the kernel to return (a chunk takes milliseconds)
// before it reports the copy as held up.
const stallGrace = 100 * time.Millisecond

func (f *Future) result() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// Done is closed when the transfer is done (Wait then returns at once).
// A nil or zero Future is done.
func (f *Future) Done() <-chan struct{} {
	if f == nil || f.done == nil {
		return closedChan
	}
	return f.done
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Transport names the transport that carried the transfer: "tcp",
// "cma" (same host, copied by process_vm_readv/writev), "shm" (same
// host, copied through a mapping of the peer's Shared memory, for all or
// part of the transfer) or "ipc" (same host, GPU memory on both sides,
// copied device to device through CUDA IPC), or "" for a call that failed
// before it started; a Send or Recv that started is always "tcp". It is
// final once the Future is done (a same-host request for memory the grant
// cannot carry goes over TCP after all).
func (f *Future) Transport() string {
	if f == nil {
		return ""
	}
	if f.shm.Load() {
		return "shm"
	}
	if f.tcp.Load() {
		return "tcp"
	}
	return f.transport
}

// Len is the length of the message a Recv received (valid after Wait
// returned nil).
func (f *Future) Len() int {
	if f == nil {
		return 0
	}
	return int(f.n.Load())
}
