package p2p

import (
	"os"
	"sync/atomic"

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
// cost is two eventfd system calls per wake-up: where no processor is
// idle, no spinning thread would start, and the channel is the cheaper
// (docs/P2P.md).
type waker struct {
	f *os.File
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
	return &waker{f: os.NewFile(uintptr(fd), "p2p-waker")}
}

var wakeOne = [8]byte{1}

// wake adds one to the counter, waking its holder. A wake that comes
// late (its Wait has returned) leaves a count that the next holder reads
// and ignores; one after close does nothing.
func (w *waker) wake() { w.f.Write(wakeOne[:]) }

// wait blocks until the counter is not zero, or the read deadline set on
// w.f passes, and takes the count.
func (w *waker) wait() error {
	_, err := w.f.Read(w.rb[:])
	return err
}

// close releases the descriptor: a holder's wait returns an error, and
// later wakes do nothing.
func (w *waker) close() { w.f.Close() }
