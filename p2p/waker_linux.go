package p2p

import (
	"os"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// waker is an event counter (eventfd) that one Wait at a time parks on,
// in the runtime's network poller, and that the goroutine completing the
// Future writes (Future.park).
//
// Why not the Future's channel alone: a goroutine that readies another
// (closing the channel it waits on) makes the runtime start a spinning
// thread for an idle processor, a cross-CPU wake-up on the completion's
// path, and that thread then takes a CPU the peer may need for the next
// request. A goroutine parked in the poller is instead found by the
// completing goroutine's own thread when that parks (the connection's
// reader, reading its next header), as a plain socket's reader is. The
// cost is one eventfd system call per wake-up, the write (the count is
// never read: take): where no processor is idle, no spinning thread
// would start, and the channel is the cheaper (docs/P2P.md).
type waker struct {
	f  *os.File
	fd int             // f's descriptor, for a Wait's ppoll (readOwn)
	rc syscall.RawConn // f's, for wait
	// readFn is take as a func value made once (a method value made per
	// wait would be allocated per wait); first and done are its holder's
	// wait's state.
	readFn func(fd uintptr) bool
	// wakeFn, made once, is what a cancelled context calls
	// (context.AfterFunc): it sets cancelled, which wait checks before it
	// parks, and wakes the holder.
	wakeFn    func()
	cancelled atomic.Bool
	first     bool
	done      *atomic.Bool
	// busy: a Wait holds the waker (one at a time; the others wait on
	// their Future's channel).
	busy atomic.Bool
	// parks counts the Waits that parked on it, wakeups the times their
	// waits returned (tests see the path taken, and that a Wait does not
	// spin).
	parks   atomic.Uint64
	wakeups atomic.Uint64
}

// newWaker returns a waker, or nil if the system gives no eventfd (Wait
// then waits on the channel alone).
func newWaker() *waker {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil
	}
	w := &waker{f: os.NewFile(uintptr(fd), "p2p-waker"), fd: fd}
	rc, err := w.f.SyscallConn()
	if err != nil {
		w.f.Close()
		return nil
	}
	w.rc = rc
	w.readFn = w.take
	w.wakeFn = func() { w.cancelled.Store(true); w.wake() }
	return w
}

var wakeOne = [8]byte{1}

// wake adds one to the counter, waking its holder. A wake that comes
// late (its Wait has returned) wakes no one: the next holder parks until
// a write after its own wait began. One after close does nothing.
func (w *waker) wake() { w.f.Write(wakeOne[:]) }

// wait blocks until done holds or the counter is written, or the read
// deadline set on w.f passes. While neither done nor
// cancelled holds it parks in the poller without reading first (a read
// would only find the counter empty): whoever writes sets one of them
// first (the completing goroutine done, a cancelled context's wakeFn
// cancelled), and every write to an eventfd is an edge for the poller, so
// a write after the poller's state was reset (RawConn.Read resets it
// before the first take) wakes this wait, and one before it finds the
// flag set.
func (w *waker) wait(done *atomic.Bool) error {
	w.first, w.done = true, done
	err := w.rc.Read(w.readFn)
	w.done = nil
	w.wakeups.Add(1)
	return err
}

// take is wait's step: on its first call it parks (false) unless done
// holds; after a wake-up it ends the wait. It never reads the counter:
// the poller's edge is the wake-up, and each write is one whatever the
// count (the kernel wakes an eventfd's pollers on every write that adds
// to it), so a read would be a system call on the wake-up's path that
// tells nothing. The count only grows, by one per wake: it would take
// 2^64-2 of them to fill it.
func (w *waker) take(fd uintptr) bool {
	if w.first {
		w.first = false
		if !w.done.Load() && !w.cancelled.Load() {
			return false
		}
	}
	return true
}

// close releases the descriptor: a holder's wait returns an error, and
// later wakes do nothing.
func (w *waker) close() { w.f.Close() }
