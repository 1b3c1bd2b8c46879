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
// cost is two eventfd system calls per wake-up (the write, and the read
// that takes the count): where no processor is idle, no spinning thread
// would start, and the channel is the cheaper (docs/P2P.md).
type waker struct {
	f  *os.File
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
	rb   [8]byte // the holder's read buffer
	// parks counts the waits that parked on it (tests see the path taken).
	parks atomic.Uint64
}

// newWaker returns a waker, or nil if the system gives no eventfd (Wait
// then waits on the channel alone).
func newWaker() *waker {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil
	}
	w := &waker{f: os.NewFile(uintptr(fd), "p2p-waker")}
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
// late (its Wait has returned) leaves a count that the next holder reads
// and ignores; one after close does nothing.
func (w *waker) wake() { w.f.Write(wakeOne[:]) }

// wait blocks until done holds or the counter is written, or the read
// deadline set on w.f passes, and takes the count. While neither done nor
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
	return err
}

// take is wait's step: on its first call it parks (false) unless done
// holds; after a wake-up it takes the count, if any, and ends the wait.
func (w *waker) take(fd uintptr) bool {
	if w.first {
		w.first = false
		if !w.done.Load() && !w.cancelled.Load() {
			return false
		}
	}
	unix.Read(int(fd), w.rb[:]) // EAGAIN: a wake-up without a count (an earlier one's edge)
	return true
}

// close releases the descriptor: a holder's wait returns an error, and
// later wakes do nothing.
func (w *waker) close() { w.f.Close() }
