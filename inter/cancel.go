package inter

import (
	"context"
	"errors"
	"sync/atomic"
)

// A call's waits on the network end by its deadline (the socket's
// deadlines), which a context's cancellation does not move: without
// more, a call across nodes whose context was cancelled waited on until
// its peers came or its timeout passed. So an algorithm's call watches its
// context (Watch … Unwatch): where the context is cancelled while the
// call runs, this rank records that it gave up (the peers that see its
// connections close then name it, as for any rank that gives up) and
// interrupts the link; the call returns context.Canceled (Cancelled). The
// communicator is broken by it, as by any error but a mismatch.
//
// The watch is registered once per context (context.AfterFunc), and kept
// from call to call while the calls share it: a planned call with the
// same context allocates nothing. A context that cannot be cancelled
// (context.Background) costs nothing; a deadline is the call's own
// timeout, which its waits keep.

// watch is a Transport's watch on its calls' context.
type watch struct {
	done   <-chan struct{} // the watched context's Done
	stop   func() bool     // unregisters the watch
	gen    uint64          // counts the contexts watched
	cur    atomic.Uint64   // gen as the call running, if one, has it
	fired  atomic.Uint64   // the gen whose context was cancelled
	inCall atomic.Bool     // a call runs, between Watch and Unwatch
	// watching says the call running is watched (its context can be
	// cancelled); the calling goroutine's alone.
	watching bool
}

// Watch starts a call of the transport under ctx: a cancellation of ctx
// from now until Unwatch ends the call (see above). One call at a time.
func (t *Transport) Watch(ctx context.Context) {
	w := &t.watch
	done := ctx.Done()
	w.watching = done != nil
	if done == nil {
		return
	}
	if done != w.done {
		// Contexts that share a Done (a value added to one) are cancelled
		// together: one watch serves them.
		if w.stop != nil {
			w.stop()
		}
		w.gen++
		gen := w.gen
		w.done = done
		w.stop = context.AfterFunc(ctx, func() {
			if !errors.Is(ctx.Err(), context.Canceled) {
				return // the deadline: the call's waits keep it
			}
			w.fired.Store(gen)
			// Not a later call's, under another context: cur is set
			// before inCall.
			if w.inCall.Load() && w.cur.Load() == gen {
				t.giveUp()
			}
		})
	}
	w.cur.Store(w.gen)
	w.inCall.Store(true)
	if w.fired.Load() == w.gen { // cancelled before the call began
		t.giveUp()
	}
}

// Unwatch ends the call that Watch began.
func (t *Transport) Unwatch() { t.watch.inCall.Store(false) }

// Cancelled reports whether the current call's context was cancelled:
// the call then returns context.Canceled, whatever its waits met.
func (t *Transport) Cancelled() bool {
	w := &t.watch
	return w.watching && w.fired.Load() == w.gen
}

// giveUp records that this rank gave up on its call (its context was
// cancelled), as the rank responsible, for good, and then interrupts
// the link.
func (t *Transport) giveUp() {
	t.put(goneRecord{culprit: t.cfg.Rank, witness: t.cfg.Rank, reason: "its call's context was cancelled"}, true)
	t.Interrupt()
}
