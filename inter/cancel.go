package inter

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
)

// A call's waits on the network end by its deadline (the socket's
// deadlines), which a context's cancellation does not move: without
// more, a call across nodes whose context was cancelled waited on until
// its peers came or its timeout passed. So an algorithm's call watches its
// context (Watch … Unwatch): where the context is cancelled while the
// call runs, this rank records that it gave up (the peers that see its
// connections close then name it, as for any rank that gives up), unless
// it has recorded a failure of its own already, and interrupts the link;
// the call returns context.Canceled (Cancelled, or Unwatch false where the
// cancel came as the call ended). The communicator is broken by it, as by
// any error but a mismatch.
//
// The watch is registered once per context (context.AfterFunc), and kept
// from call to call while the calls share it: a planned call with the
// same context allocates nothing (one with a new context each time
// registers each). A context that cannot be cancelled
// (context.Background) costs nothing; a deadline is the call's own
// timeout, which its waits keep. Close releases the watch.

// watch is a Transport's watch on its calls' context.
type watch struct {
	done <-chan struct{} // the watched context's Done
	stop func() bool     // unregisters the watch
	gen  uint64          // counts the contexts watched
	// state is the call's under watch gen: 0 between calls, gen<<2
	// while one runs, with gaveUp or noted once a cancel came.
	state atomic.Uint64
	fired atomic.Uint64 // the latest gen whose context was cancelled
	// watching says the call running is watched (its context can be
	// cancelled); the calling goroutine's alone.
	watching bool
	// acting is held while a cancel ends a call (trigger), so that Close
	// waits for it.
	acting sync.Mutex
}

// The state's low bits: the cancel ended the call (gaveUp), or came
// after the call had failed of itself (noted).
const (
	gaveUp = 1
	noted  = 2
)

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
			for f := w.fired.Load(); f < gen && !w.fired.CompareAndSwap(f, gen); f = w.fired.Load() {
			}
			t.trigger(gen)
		})
	}
	w.state.Store(w.gen << 2)
	// Cancelled before the call began: the watch's function runs on a
	// goroutine of its own, and may not have fired yet (the call's sends
	// then went out, and the peers finished the call while this rank
	// failed it); ask the context itself.
	if w.fired.Load() == w.gen || errors.Is(ctx.Err(), context.Canceled) {
		t.trigger(w.gen)
	}
}

// trigger ends the call running under watch gen, if one is: only a call
// of that gen, and only once (the state's compare-and-swap, which Unwatch's
// swap excludes).
func (t *Transport) trigger(gen uint64) {
	w := &t.watch
	w.acting.Lock()
	defer w.acting.Unlock()
	if !w.state.CompareAndSwap(gen<<2, gen<<2|gaveUp) {
		return // between calls, or another context's call
	}
	if !t.recordGivingUp() {
		// The call had failed already (its record says how): that stays
		// its error, the cancel only ends its waits.
		w.state.CompareAndSwap(gen<<2|gaveUp, gen<<2|noted)
	}
	t.Interrupt()
}

// Unwatch ends the call that Watch began. It reports false where the
// call's context was cancelled meanwhile and ended it (the link is being
// interrupted): the call then fails with context.Canceled, whatever its
// waits met. A second Unwatch of the call reports true.
func (t *Transport) Unwatch() bool {
	w := &t.watch
	if !w.watching {
		return true
	}
	w.watching = false
	return w.state.Swap(0)&gaveUp == 0
}

// Cancelled reports whether the running call's context was cancelled
// and ended it: the call then returns context.Canceled, whatever its
// waits met.
func (t *Transport) Cancelled() bool {
	w := &t.watch
	return w.watching && w.state.Load()&gaveUp != 0
}

// closeWatch releases the watch, after a cancel in progress.
func (t *Transport) closeWatch() {
	w := &t.watch
	if w.stop != nil {
		w.stop()
	}
	w.acting.Lock() // a trigger that began before stop: it ends first
	w.acting.Unlock()
}

// recordGivingUp records, for good, that this rank gave up on its call
// because its context was cancelled, holding itself responsible: unless
// it has recorded a failure already (a peer lost, a wait in vain), which
// stays its account (a program that cancels on a signal sent because a
// peer failed must not take the blame).
// It reports false where a failure was recorded already.
func (t *Transport) recordGivingUp() bool {
	t.recordMu.Lock()
	defer t.recordMu.Unlock()
	if t.recorded != nil || t.losing.Load() {
		return false
	}
	r := goneRecord{culprit: t.cfg.Rank, witness: t.cfg.Rank, reason: "its call's context was cancelled"}
	t.recorded, t.recordedFinal = &r, true
	t.write(r)
	return true
}
