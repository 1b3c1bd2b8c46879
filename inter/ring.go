package inter

import (
	"context"
	"errors"
	"time"

	"github.com/slimego/slimego/internal/callhash"
	"github.com/slimego/slimego/internal/fault"
)

// RingAG is the ring all-gather over TCP and host memory.
type RingAG = RingOver[[]byte]

// RingOp is a planned RingAG all-gather.
type RingOp = RingOpOver[[]byte]

// RingOver is a flat ring all-gather over a link of memory M (host bytes
// or device spans): every step crosses the link, whatever the nodes. It
// serves layouts the hierarchical schedule does not, and as the baseline
// the hierarchical one is measured against.
type RingOver[M any] struct {
	t          Link[M]
	p, rank    int
	next, prev int
	steps      []RingStep
	epoch      uint64
	timeout    time.Duration
	broken     error
	barrier    *RingOpOver[M]
}

// NewRing uses a transport whose peers are Ring's neighbours.
func NewRing(t *Transport, p, rank int, timeout time.Duration) *RingAG {
	return NewRingOver(t.Link(), p, rank, timeout)
}

// NewRingOver uses a link whose peers are Ring's neighbours.
func NewRingOver[M any](t Link[M], p, rank int, timeout time.Duration) *RingOver[M] {
	next, prev, steps := Ring(p, rank)
	return &RingOver[M]{t: t, p: p, rank: rank, next: next, prev: prev, steps: steps, timeout: timeout}
}

// RingPeers are the ranks a ring member connects to.
func RingPeers(p, rank int) []int {
	if p == 1 {
		return nil
	}
	next, prev, _ := Ring(p, rank)
	if next == prev {
		return []int{next}
	}
	return []int{next, prev}
}

// RingOpOver is a planned ring all-gather.
type RingOpOver[M any] struct {
	r           *RingOver[M]
	name        string
	dst, src    M
	sizes, offs []int
	hash        uint64
}

// Plan prepares a ring all-gather (same arguments as Hier.Plan).
func (r *RingOver[M]) Plan(name string, dst, src M, sizes, offs []int) (*RingOpOver[M], error) {
	o := &RingOpOver[M]{r: r, name: name, sizes: make([]int, r.p), offs: make([]int, r.p)}
	return o, o.Set(dst, src, sizes, offs)
}

// Set re-plans o without allocating, but for the link's buffers, which
// it reserves for the call's messages (Link.Reserve) so that Run
// allocates none.
func (o *RingOpOver[M]) Set(dst, src M, sizes, offs []int) error {
	r := o.r
	if r.broken != nil {
		return r.broken
	}
	if err := checkCall(o.name, r.rank, r.p, r.t.Len(dst), r.t.Len(src), sizes, offs); err != nil {
		return err
	}
	copy(o.sizes, sizes)
	copy(o.offs, offs)
	o.dst, o.src = dst, src
	o.hash = callhash.Sum(o.name, sizes)
	if len(r.steps) > 0 {
		send, recv := sizes[r.rank], 0
		for _, st := range r.steps {
			send, recv = max(send, sizes[st.Send]), max(recv, sizes[st.Recv])
		}
		if err := r.t.Reserve(r.next, send, 0); err != nil {
			return &fault.OpError{Op: o.name, Rank: r.rank, Peer: r.next, Err: err}
		}
		if err := r.t.Reserve(r.prev, 0, recv); err != nil {
			return &fault.OpError{Op: o.name, Rank: r.rank, Peer: r.prev, Err: err}
		}
	}
	return nil
}

func (o *RingOpOver[M]) block(q int) M { return o.r.t.Slice(o.dst, o.offs[q], o.sizes[q]) }

// Run executes the ring once. A mismatch travels round the ring as a
// poisoned hash, so that every rank returns ErrSizeMismatch.
func (o *RingOpOver[M]) Run(ctx context.Context) error {
	r := o.r
	if r.broken != nil {
		return r.broken
	}
	e := r.epoch + 1
	r.epoch = e
	deadline := callDeadline(ctx, r.timeout)
	r.t.Watch(ctx)
	defer r.t.Unwatch()
	// The own block goes first, from src; its copy into dst rides with
	// that send (Transport.SendCopy) where it is large, or is made here,
	// right after the first send is under way: the copy then overlaps the
	// block's way to the next rank and the previous rank's to this one,
	// instead of delaying both. Riding saves reading the block from memory
	// a second time; with 2 ranks per node it made no difference either
	// way (docs/PERFORMANCE.md).
	own := o.block(r.rank)
	var also M
	copyOwn := false
	if n := r.t.Len(own); n > 0 && !r.t.Same(own, o.src) {
		if len(r.steps) > 0 && r.t.CopyRides(n) {
			also = own
		} else {
			copyOwn = true
		}
	}
	if copyOwn && len(r.steps) == 0 {
		if err := r.t.Copy(own, o.src, deadline); err != nil {
			return o.fail(err, -1)
		}
	}
	hash := o.hash
	var mismatch error
	for s, st := range r.steps {
		r.t.Recv(r.prev, e, o.hash, o.block(st.Recv), deadline)
		var cerr error
		if s == 0 {
			r.t.SendCopy(r.next, e, hash, o.src, also, deadline)
			if copyOwn {
				cerr = r.t.Copy(own, o.src, deadline)
			}
		} else {
			r.t.Send(r.next, e, hash, o.block(st.Send), deadline)
		}
		rerr := r.t.WaitRecv(r.prev)
		if rerr != nil && !errors.Is(rerr, fault.ErrSizeMismatch) {
			// The call has failed: end the send (the successor may be
			// late, or stuck) rather than wait for it, and collect it,
			// so that nothing reads src once Run has returned.
			// Its account goes to the store first (Record), for the
			// successor, which sees only the connection close.
			// A timed-out wait then follows the records of the ranks
			// it waited for through (Explain).
			if r.t.Cancelled() { // this rank gave up (recorded, interrupted)
				r.t.WaitSend(r.next)
				return o.fail(context.Canceled, -1)
			}
			err, peer := blame(r.t, rerr, r.prev)
			r.t.Record(peer, err)
			r.t.Interrupt()
			r.t.WaitSend(r.next)
			peer, err = r.t.Explain(peer, err)
			r.t.Record(peer, err)
			return o.fail(err, peer)
		}
		serr := r.t.WaitSend(r.next)
		// A peer's failure says more than this rank's copy failing beside it.
		if serr != nil && r.t.Cancelled() {
			return o.fail(context.Canceled, -1)
		}
		if serr != nil {
			err, peer := blame(r.t, serr, r.next)
			r.t.Record(peer, err)
			peer, err = r.t.Explain(peer, err)
			r.t.Record(peer, err)
			return o.fail(err, peer)
		}
		if cerr != nil {
			return o.fail(cerr, -1)
		}
		if rerr != nil && mismatch == nil {
			mismatch = &fault.OpError{Op: o.name, Rank: r.rank, Peer: r.prev, Err: rerr}
			hash = o.hash ^ 0x706f69736f6e // pass the verdict on
		}
	}
	if !r.t.Unwatch() { // cancelled as it ended: the link is interrupted
		return o.fail(context.Canceled, -1)
	}
	return mismatch
}

func (o *RingOpOver[M]) fail(err error, peer int) error {
	err = &fault.OpError{Op: o.name, Rank: o.r.rank, Peer: peer, Err: err}
	o.r.broken = fault.New("communicator", o.r.rank, -1, fault.ErrClosed, "broken by an earlier error: %v", err)
	return err
}

// Barrier returns once every rank has entered it.
func (r *RingOver[M]) Barrier(ctx context.Context) error {
	if r.barrier == nil {
		z := make([]int, r.p)
		var none M
		op, err := r.Plan("barrier", none, none, z, z)
		if err != nil {
			return err
		}
		r.barrier = op
	}
	return r.barrier.Run(ctx)
}
