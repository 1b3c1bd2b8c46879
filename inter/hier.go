package inter

import (
	"context"
	"errors"
	"runtime"
	"time"

	"github.com/slimego/slimego/internal/callhash"
	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/intra"
)

// Hier is the hierarchical all-gather over shared memory and TCP.
type Hier = HierOver[[]byte]

// HierOp is a planned Hier all-gather.
type HierOp = HierOpOver[[]byte]

// HierOver runs the rail-aligned hierarchical all-gather for one rank:
// nodes × local ranks, global rank = node·local + local rank, over a
// node-local gather and an inter-node link of one memory M (host bytes or
// device spans): the algorithm is written once for every backend.
type HierOver[M any] struct {
	g       intra.NodeGather[M]
	t       Link[M]
	nodes   int
	local   int
	node    int
	lrank   int
	rank    int
	order   []int // NodeOrder
	peers   []int // RailPeers, matching order[1:]
	epoch   uint64
	timeout time.Duration
	broken  error
	barrier *HierOpOver[M]
}

// NewHier joins an intra-node group and a transport to the rank's rail
// peers (which must be RailPeers) into one all-gather.
func NewHier(g *intra.Group, t *Transport, nodes, local, rank int, timeout time.Duration) *Hier {
	return NewHierOver(g.Node(), t.Link(), nodes, local, rank, timeout)
}

// NewHierOver joins a node-local gather (whose local rank must be
// rank mod local) and a link to the rank's rail peers (which must be
// RailPeers) into one all-gather.
func NewHierOver[M any](g intra.NodeGather[M], t Link[M], nodes, local, rank int, timeout time.Duration) *HierOver[M] {
	node := rank / local
	return &HierOver[M]{g: g, t: t, nodes: nodes, local: local, node: node, lrank: rank % local, rank: rank,
		order: NodeOrder(nodes, node), peers: RailPeers(nodes, local, rank), timeout: timeout}
}

// HierOpOver is a planned hierarchical all-gather; Run allocates nothing
// (on host memory, given the same context as the run before, or one that
// cannot be cancelled: see Transport.Watch; a GPU node's gathers re-plan
// on Set).
type HierOpOver[M any] struct {
	h     *HierOver[M]
	name  string
	dst   M
	src   M
	sizes []int // global
	offs  []int
	hash  uint64
	ops   []intra.NodeOp[M] // one per node, in h.order
	// ownRides: the rank is alone on its node, the call is out of place
	// and the block large enough (Transport.CopyRides), so the own block's
	// copy rides with the first send (Transport.SendCopy) instead of
	// ops[0] making it. Only for a rank alone on its node: with 2 ranks
	// per node riding gained nothing (docs/PERFORMANCE.md).
	ownRides bool
	sb       []int // scratch: one node's sizes and offsets
	ob       []int
}

// Plan prepares an all-gather in which global rank r's sizes[r] bytes land
// at offs[r] of dst on every rank.
func (h *HierOver[M]) Plan(name string, dst, src M, sizes, offs []int) (*HierOpOver[M], error) {
	o := &HierOpOver[M]{h: h, name: name, sizes: make([]int, len(sizes)), offs: make([]int, len(offs)),
		sb: make([]int, h.local), ob: make([]int, h.local)}
	return o, o.Set(dst, src, sizes, offs)
}

// Set re-plans o for other buffers; once o has run it allocates nothing.
// It reserves the link's buffers for the call's messages (Link.Reserve),
// so that Run allocates none.
func (o *HierOpOver[M]) Set(dst, src M, sizes, offs []int) error {
	h := o.h
	if h.broken != nil {
		return h.broken
	}
	if err := checkCall(o.name, h.rank, h.nodes*h.local, h.g.Len(dst), h.g.Len(src), sizes, offs); err != nil {
		return err
	}
	copy(o.sizes, sizes)
	copy(o.offs, offs)
	o.dst, o.src = dst, src
	o.hash = callhash.Sum(o.name, sizes)
	for _, p := range h.peers {
		if err := h.t.Reserve(p, sizes[h.rank], sizes[p]); err != nil {
			return &fault.OpError{Op: o.name, Rank: h.rank, Peer: p, Err: err}
		}
	}
	own := o.own()
	n := h.g.Len(src)
	o.ownRides = h.local == 1 && len(h.peers) > 0 && n > 0 && !h.g.Same(own, src) && h.t.CopyRides(n) && h.g.CanLeaveOwn()
	for k, b := range h.order {
		for j := range h.local {
			o.sb[j], o.ob[j] = sizes[b*h.local+j], offs[b*h.local+j]
		}
		mine := b*h.local + h.lrank
		blk := src
		if b != h.node {
			blk = h.g.Slice(dst, offs[mine], sizes[mine])
		}
		if k < len(o.ops) {
			if err := o.ops[k].Set(dst, blk, o.sb, o.ob); err != nil {
				return err
			}
			continue
		}
		op, err := h.g.Plan(o.name, dst, blk, o.sb, o.ob)
		if err != nil {
			return err
		}
		o.ops = append(o.ops, op)
	}
	o.ops[0].LeaveOwn(o.ownRides)
	return nil
}

// Run executes the all-gather once. A mismatch anywhere is ErrSizeMismatch
// on every rank, after every rank has completed the schedule, so that the
// communicator stays usable; any other error breaks it.
func (o *HierOpOver[M]) Run(ctx context.Context) error {
	h := o.h
	if h.broken != nil {
		return h.broken
	}
	e := h.epoch + 1
	h.epoch = e
	deadline := callDeadline(ctx, h.timeout)
	h.t.Watch(ctx)
	defer h.t.Unwatch()
	for k, p := range h.peers {
		h.t.Recv(p, e, o.hash, h.g.Slice(o.dst, o.offs[p], o.sizes[p]), deadline)
		if k == 0 && o.ownRides {
			h.t.SendCopy(p, e, o.hash, o.src, o.own(), deadline)
		} else {
			h.t.Send(p, e, o.hash, o.src, deadline)
		}
	}
	var mismatch error
	note := func(err error) error {
		if err == nil {
			return nil
		}
		if errors.Is(err, fault.ErrSizeMismatch) {
			if mismatch == nil {
				mismatch = err
			}
			return nil
		}
		return err
	}
	// The node's own blocks first: they need no network. The connection
	// goroutines that Send and Recv just readied take this processor
	// first, so that the network starts before the own copy and the link
	// does not idle while this processor copies; that carried more of the
	// link's bandwidth at 1 and 4 MiB (docs/PERFORMANCE.md).
	if !h.t.Direct(h.g.Len(o.src)) && !o.ownRides {
		runtime.Gosched()
	}
	if err := note(o.ops[0].Run(ctx)); err != nil {
		return o.failDrained(err, -1, 0, 0)
	}
	for k, p := range h.peers {
		if rerr := h.t.WaitRecv(p); rerr != nil {
			if !errors.Is(rerr, fault.ErrSizeMismatch) {
				return o.failDrained(rerr, p, k+1, 0)
			}
			if mismatch == nil {
				mismatch = &fault.OpError{Op: o.name, Rank: h.rank, Peer: p, Err: rerr}
			}
			if err := note(o.ops[k+1].RunMismatched(ctx)); err != nil {
				return o.failDrained(err, -1, k+1, 0)
			}
			continue
		}
		if err := note(o.ops[k+1].Run(ctx)); err != nil {
			return o.failDrained(err, -1, k+1, 0)
		}
	}
	for i, p := range h.peers {
		if err := h.t.WaitSend(p); err != nil {
			return o.failDrained(err, p, len(h.peers), i+1)
		}
	}
	if !h.t.Unwatch() { // cancelled as it ended: the link is interrupted
		return o.fail(context.Canceled, -1)
	}
	return mismatch
}

// failDrained is fail, and then ends and collects the transfers still in
// flight: the receives from peers[recvd:] and the sends to peers[sent:].
// A receive not collected would go on writing dst after Run returned (and
// a send reading src), until its peer's bytes or the call's deadline
// came. A link error (peer >= 0) names the peer the link lost first
// (blame). This rank's account goes to the store (Record), and the rank
// it holds responsible is asked in turn (Explain: a peer that gave up, or
// one waited for in vain, may have recorded another); then the node's
// other ranks are told (fail) and the link is interrupted, its transfers
// then ending at once (the communicator is broken: it has no further use
// for it): both the node's ranks and the rail peers find the account
// when they see this rank give up.
func (o *HierOpOver[M]) failDrained(err error, peer, recvd, sent int) error {
	h := o.h
	q := peer // the rank this rank holds responsible
	var oe *fault.OpError
	if h.t.Cancelled() || errors.Is(err, context.Canceled) {
		// This rank gave up: its context was cancelled (the link's
		// watch, or the node's gather, saw it first): whatever its
		// waits met came of that.
		err, peer, q = context.Canceled, -1, -1
	} else if peer >= 0 { // the link's error: the peer it lost first is the one to name
		err, peer = blame(h.t, err, peer)
		q = peer
	} else if errors.As(err, &oe) && oe.Peer >= 0 && oe.Peer != h.rank {
		q = oe.Peer // a node peer's failure, as the node's gather saw it
	}
	h.t.Record(q, err)
	if p, why := h.t.Explain(q, err); why != err {
		err, peer = why, p
		h.t.Record(peer, err)
	}
	err = o.fail(err, peer)
	h.t.Interrupt()
	for _, p := range h.peers[recvd:] {
		h.t.WaitRecv(p)
	}
	for _, p := range h.peers[sent:] {
		h.t.WaitSend(p)
	}
	return err
}

// own is this rank's block of dst.
func (o *HierOpOver[M]) own() M {
	r := o.h.rank
	return o.h.g.Slice(o.dst, o.offs[r], o.sizes[r])
}

// fail breaks the communicator and tells the node's other ranks.
func (o *HierOpOver[M]) fail(err error, peer int) error {
	h := o.h
	var oe *fault.OpError
	if !errors.As(err, &oe) {
		err = &fault.OpError{Op: o.name, Rank: h.rank, Peer: peer, Err: err}
	}
	h.g.Abandon(err)
	h.broken = fault.New("communicator", h.rank, -1, fault.ErrClosed, "broken by an earlier error: %v", err)
	return err
}

// Barrier returns once every rank of every node has entered it.
func (h *HierOver[M]) Barrier(ctx context.Context) error {
	if h.barrier == nil {
		z := make([]int, h.nodes*h.local)
		var none M
		op, err := h.Plan("barrier", none, none, z, z)
		if err != nil {
			return err
		}
		h.barrier = op
	}
	return h.barrier.Run(ctx)
}

// checkCall validates one rank's arguments to an all-gather over P ranks.
func checkCall(op string, rank, P int, dstLen, srcLen int, sizes, offs []int) error {
	if len(sizes) != P || len(offs) != P {
		return fault.New(op, rank, -1, fault.ErrInvalid, "%d sizes and %d offsets for %d ranks", len(sizes), len(offs), P)
	}
	for r := range P {
		if sizes[r] < 0 || offs[r] < 0 || offs[r] > dstLen || sizes[r] > dstLen-offs[r] {
			return fault.New(op, rank, -1, fault.ErrInvalid, "block of rank %d (%d bytes at %d) does not fit the %d-byte destination", r, sizes[r], offs[r], dstLen)
		}
	}
	if srcLen != sizes[rank] {
		return fault.New(op, rank, -1, fault.ErrInvalid, "source holds %d bytes, this rank's block is %d", srcLen, sizes[rank])
	}
	return nil
}
