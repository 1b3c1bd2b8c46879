package intra

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/internal/futex"
)

// pureSpin is how long a wait polls before each further poll yields the
// processor (sched_yield). A peer on a core of its own answers within it.
// A longer wait may be for a peer that waits for this very processor: when
// another process holds the other core, the ranks of a pair take turns on
// one, and a pure spin keeps the peer off it until the spin ends (half of
// SpinTime each way, every call). A yield lets it run at once, and costs
// next to nothing where nothing else waits for the processor. Sleeping
// sooner is no cure: a futex wake-up moves the sleeper to the waker's core,
// which keeps such a pair together.
const pureSpin = 2 * time.Microsecond

// maxSleep bounds one futex sleep, so that a sleeping rank checks its
// deadline and its peers' liveness at least this often.
const maxSleep = 10 * time.Millisecond

// waiter is the state of one operation's waits: spin, then sleep on the
// rank's own bell, checking deadline and peers between sleeps. It lives on
// the caller's stack.
type waiter struct {
	g         *Group
	op        string
	done      <-chan struct{}
	ctx       context.Context
	deadline  time.Time
	budget    time.Duration // how long the waits may take, for errors
	idleSince time.Time
	armed     bool
	bell      uint32
	round     uint64 // advanced on progress; see Group.suspected
	naps      uint64 // futex sleeps so far
	slept     bool   // the last idle slept; callers with several peers check them all
}

// w0round starts a waiter's rounds past every mark an earlier waiter left
// in g.suspected.
func w0round(g *Group) uint64 {
	g.rounds += 1 << 32
	return g.rounds
}

// newWaiter starts the waits of one call. Their deadline is set when the
// call first finds nothing to do (start): a call whose peers are there
// already never waits, and reads no clock for it.
func (g *Group) newWaiter(ctx context.Context, op string) waiter {
	return waiter{g: g, op: op, done: ctx.Done(), ctx: ctx, round: w0round(g)}
}

// start sets the deadline of the call's waits: Timeout after now, its
// first wait, or the context's deadline if that comes first.
func (w *waiter) start(now time.Time) {
	timeout := w.g.cfg.Timeout
	w.deadline, w.budget = now.Add(timeout), timeout
	if d, ok := w.ctx.Deadline(); ok && d.Before(w.deadline) {
		w.deadline = d
		w.budget = max(d.Sub(now), 0).Round(time.Millisecond)
	}
}

// progress says the caller's last poll found work: spin afresh next time.
func (w *waiter) progress() {
	w.idleSince = time.Time{}
	w.round++
	if w.armed {
		atomic.StoreUint32(&w.g.ctrls[w.g.rank].sleeping, 0)
		w.armed = false
	}
}

// idle is called when a poll found nothing to do; the caller polls again
// after it returns nil. peer is the rank the caller waits for, what the
// thing it waits for; both go into the error.
func (w *waiter) idle(peer int, what string) error {
	now := time.Now()
	if w.idleSince.IsZero() {
		if w.deadline.IsZero() {
			w.start(now)
		}
		w.idleSince = now
		return nil
	}
	if d := now.Sub(w.idleSince); d < w.g.spin {
		// Polls past pureSpin, and every poll where ranks outnumber
		// cores, hand the processor over first (see pureSpin).
		if w.g.oversb || d > pureSpin {
			if w.g.oversb && w.g.goYield {
				runtime.Gosched()
			}
			rawYield()
		}
		return nil
	}
	me := w.g.ctrls[w.g.rank]
	if !w.armed {
		// Announce the sleep, then let the caller poll once more: a
		// publisher that stores after that poll sees sleeping != 0.
		atomic.StoreUint32(&me.sleeping, 1)
		w.bell = atomic.LoadUint32(&me.bell)
		w.armed = true
		return nil
	}
	futex.Wait(&me.bell, w.bell, min(maxSleep, max(time.Until(w.deadline), time.Microsecond)))
	atomic.StoreUint32(&me.sleeping, 0)
	w.armed = false
	w.slept = true
	w.naps++
	return w.check(peer, what)
}

// check turns a passed deadline, a cancelled context or a lost peer into an
// error.
func (w *waiter) check(peer int, what string) error {
	g := w.g
	// Only the awaited peer matters: one that finished its part and left is
	// no loss. A peer may publish and then leave between our poll and this
	// check, so a loss counts only when a further poll still finds nothing.
	if err, suspected := w.suspectPeer(peer, what); suspected {
		return err
	}
	select {
	case <-w.done:
		err := w.ctx.Err()
		if err == context.DeadlineExceeded {
			// The deadline passed waiting for peer: it is late.
			return fault.New(w.op, g.global(g.rank), g.global(peer), fault.ErrTimeout, "context ended while waiting for %s", what)
		}
		// Cancelled: this rank gave up, and no peer is at fault (as
		// across nodes); the peer it waited for is only told.
		return fault.New(w.op, g.global(g.rank), -1, err, "context ended while waiting for %s of rank %d", what, g.global(peer))
	default:
	}
	if time.Now().After(w.deadline) {
		if why := g.lostHere(peer); why != "" {
			// Failed, but seen only once (suspectPeer counts a loss
			// at its second sighting): name whom it gave up on.
			why, culprit := g.follow(peer, why)
			return fault.New(w.op, g.global(g.rank), culprit, fault.ErrPeerLost, "%s (while this rank waited %v for %s)", why, w.budget, what)
		}
		return fault.New(w.op, g.global(g.rank), g.global(peer), fault.ErrTimeout, "waited %v for %s", w.budget, what)
	}
	return nil
}

// suspectPeer checks that peer p, which this rank depends on, can still do
// its part: a loss is an error once seen twice in a row, with a poll between
// (a peer may publish its last part and leave between a poll and a check).
// suspected reports a first sighting.
func (w *waiter) suspectPeer(p int, what string) (err error, suspected bool) {
	g := w.g
	why, culprit := g.lost(p)
	if why == "" {
		return nil, false
	}
	if g.suspected[p] == w.round && g.suspectNap[p] < w.naps {
		return fault.New(w.op, g.global(g.rank), culprit, fault.ErrPeerLost, "%s (while this rank waited for %s)", why, what), true
	}
	if g.suspected[p] != w.round {
		g.suspected[p], g.suspectNap[p] = w.round, w.naps
	}
	return nil, true
}

// checkAll checks every peer that depends says this rank waits on.
func (w *waiter) checkAll(depends func(p int, sending bool) (bool, string), sending bool) error {
	for p := range w.g.size {
		if p == w.g.rank {
			continue
		}
		if dep, what := depends(p, sending); dep {
			if err, _ := w.suspectPeer(p, what); err != nil {
				return err
			}
		}
	}
	return nil
}

// lost says why peer p can no longer do its part, or "", and the global
// rank that the loss is to be blamed on: p, or, where p gave up the call on
// a peer of this group that it found lost or late (its ctrl line's blame),
// that peer, followed from rank to rank to one that blames none. Ranks that
// wait for the rank that saw a death first then name the dead rank, as
// that rank does.
func (g *Group) lost(p int) (string, int) {
	why := g.lostHere(p)
	if why == "" {
		return "", g.global(p)
	}
	return g.follow(p, why)
}

// follow is lost's walk along the blames from peer p, which gave up for
// why: the account to report, and the global rank it names. The walk
// ends at a rank that blames none, or blames a rank outside the group,
// itself, this rank (the account then says so: this rank was the late
// one), or one the walk has passed (ranks that gave up on each other: the
// last one reached before the cycle closes is named, whatever the group's
// size). It runs on a failure's path only.
func (g *Group) follow(p int, why string) (string, int) {
	q := p
	seen := make([]bool, g.size)
	for range g.size {
		seen[q] = true
		b := atomic.LoadUint32(&g.ctrls[q].blame)
		c := g.localOf(int(b) - 1)
		if b != 0 && c == g.rank {
			// q gave up the call on this rank (it waited for it past
			// its timeout): q is named, but this rank is what it
			// found late, which the account says.
			why += fmt.Sprintf(" (rank %d gave up the call on this rank)", g.global(q))
			break
		}
		if b == 0 || c < 0 || seen[c] {
			break
		}
		why = fmt.Sprintf("rank %d gave up the call on it", g.global(q))
		if w := g.lostHere(c); w != "" {
			why += " (" + w + ")"
		}
		q = c
	}
	return why, g.global(q)
}

// localOf is the local rank of global rank r, or -1 where r is none of
// this group's.
func (g *Group) localOf(r int) int {
	for l, gr := range g.cfg.Ranks {
		if gr == r {
			return l
		}
	}
	return -1
}

// lostHere says why peer p itself can no longer do its part, or "".
func (g *Group) lostHere(p int) string {
	if p < 0 || p == g.rank {
		return ""
	}
	switch atomic.LoadUint32(&g.ctrls[p].state) {
	case stateClosed:
		return "peer closed its communicator"
	case stateFailed:
		return "peer abandoned the operation after an error of its own"
	}
	if g.pidfds[p] >= 0 && exited(g.pollfds[p:p+1]) >= 0 {
		return "peer process exited"
	}
	return ""
}

// ring wakes peer p if it sleeps. Publishers call it after every store a
// peer may wait for.
func (g *Group) ring(p int) {
	c := g.ctrls[p]
	if atomic.LoadUint32(&c.sleeping) != 0 {
		atomic.AddUint32(&c.bell, 1)
		futex.Wake(&c.bell, 1)
	}
}

func (g *Group) ringAll() {
	for p := range g.ctrls {
		if p != g.rank {
			g.ring(p)
		}
	}
}

// rawYield is sched_yield(2) without the runtime's system-call
// bookkeeping: the call never blocks, but it may leave this thread off
// its processor while other ranks run, and a system call that lasts
// that long would have the runtime's monitor hand the goroutine's
// processor to another thread, a wake-up for nothing.
func rawYield() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
