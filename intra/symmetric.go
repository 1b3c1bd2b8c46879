package intra

import (
	"context"
	"errors"
	"math"
	"strconv"
	"unsafe"

	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/internal/shm"
)

// Buffer is symmetric memory: every rank of the group allocates one of the
// same size in the same call, and each rank can read every other rank's.
// An all-gather whose source lies in a Buffer reads it in place (zero copy).
type Buffer struct {
	g      *Group
	id     int
	seg    *shm.Segment
	stride int
	bytes  []byte
}

// Bytes is this rank's part of the buffer.
func (b *Buffer) Bytes() []byte { return b.bytes }

// File is the file that holds the buffer (a file in /dev/shm that every
// rank of the group maps whole) and where this rank's part, Bytes,
// starts in it; fd is -1 once the buffer is freed. The descriptor stays
// the buffer's (Free closes it): a process that maps the file itself,
// as p2p.MapShared does, duplicates it. Every rank's part lies at its
// own offset of the same file.
func (b *Buffer) File() (fd int, off int64) {
	if b.g.bufs == nil || b.g.bufs[b.id] != b {
		return -1, 0
	}
	return b.seg.FD(), int64(pageBytes + b.g.rank*b.stride)
}

// Alloc allocates n bytes of symmetric memory on every rank. It is
// collective: every rank calls it with the same n, in the same order.
// It succeeds on every rank or on none: where some rank could not make
// or map its part (its deadline passed while rank 0 still made a large
// segment, say), the others free theirs and fail with ErrPeerLost naming
// it.
func (g *Group) Alloc(ctx context.Context, n int) (*Buffer, error) {
	if g.broken != nil {
		return nil, g.broken
	}
	b, err := g.alloc(ctx, n)
	aerr := g.agree(ctx, err == nil)
	if err != nil {
		return nil, err
	}
	if aerr != nil {
		// Every rank that maps the segment has mapped it (the others
		// failed), but one that never read its name has not counted
		// itself (shareSegment): its name may still be there.
		shm.Unlink(b.seg.Name)
		b.Free()
		return nil, aerr
	}
	return b, nil
}

// agree tells the group, in shared memory, whether this rank holds its
// part of the buffer just allocated (ok), and learns the same of every
// other rank: every rank's Alloc runs it once, whatever happened before.
// A rank that failed publishes a hash that the others do not share and
// returns at once (announceMismatched), so that they return an error
// naming it. ctx may be what ended the allocation: the waits keep the
// group's timeout.
func (g *Group) agree(ctx context.Context, ok bool) error {
	z := make([]int, g.size)
	op, err := g.Plan("alloc.agree", nil, nil, z, z)
	if err != nil {
		return err
	}
	if !ok {
		op.announceMismatched()
		return nil
	}
	err = op.Run(context.WithoutCancel(ctx))
	var oe *fault.OpError
	if errors.Is(err, ErrCallsDiffer) && errors.As(err, &oe) {
		return fault.New("alloc", g.global(g.rank), oe.Peer, fault.ErrPeerLost, "rank %d could not allocate its part of the buffer; nothing is left allocated", oe.Peer)
	}
	return err
}

// alloc is Alloc on this rank alone.
func (g *Group) alloc(ctx context.Context, n int) (*Buffer, error) {
	// Every Alloc call, failed or not, has keys of its own (every rank
	// counts the calls alike, a refused one too, so that the ranks stay
	// in step): a failed one's value never answers a later one. The '.'
	// ends the number, so that no call's key starts another's (an abort
	// of "buf1." spares "buf10.").
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, g.cfg.Timeout)
		defer cancel()
	}
	seq := g.allocs
	g.allocs++
	key := "buf" + strconv.FormatUint(seq, 10) + "."
	var bad error
	if n < 0 {
		bad = fault.New("alloc", g.global(g.rank), -1, fault.ErrInvalid, "negative size %d", n)
	} else if n > (math.MaxInt-2*pageBytes)/g.size {
		bad = fault.New("alloc", g.global(g.rank), -1, fault.ErrInvalid, "%d bytes on each of %d ranks do not fit in memory", n, g.size)
	}
	// A local rank that dies now fails the others' waits in the store.
	stop := g.watchExits(g.cfg.Key + "/" + key)
	defer stop()
	// The sizes first, before any memory: where they differ (or one is
	// refused above), every rank fails and nothing is allocated.
	if err := g.sameSize(ctx, "alloc", g.cfg.Key+"/"+key, n); err != nil {
		if bad != nil {
			return nil, bad // this rank's own mistake, in its own words
		}
		return nil, err
	}
	if bad != nil {
		return nil, bad // every rank refused alike
	}
	// The buffer's id, which the headers name, is the call's number, the
	// same on every rank: a count of the buffers this rank holds would
	// skew after an Alloc that failed on some ranks only (a deadline), and
	// peers would read in place from another buffer than the one named.
	id := int(seq)
	stride := roundUp(max(n, 1), pageBytes)
	// One page of identity, then each rank's part.
	total := pageBytes + g.size*stride
	ident := identity{kind: kindBuffer, a: uint32(g.size), b: uint32(seq), c: uint32(stride / pageBytes), job: g.job, total: uint64(total)}
	seg, err := g.shareSegment(ctx, "alloc", key, total, ident)
	if err != nil {
		return nil, err
	}
	seg.Skip(pageBytes)
	b := &Buffer{g: g, id: id, seg: seg, stride: stride}
	b.bytes = seg.Mem[g.rank*stride : g.rank*stride+n : g.rank*stride+n]
	for len(g.bufs) <= id {
		g.bufs = append(g.bufs, nil) // calls refused or failed here
	}
	g.bufs[id] = b
	return b, nil
}

// Free unmaps the buffer on this rank. Every rank frees it, between
// operations that use it.
func (b *Buffer) Free() error {
	if b.g.bufs == nil || b.g.bufs[b.id] != b {
		return nil
	}
	b.g.bufs[b.id] = nil
	b.bytes = nil
	return b.seg.Close()
}

// FreedCheck is the check that a caller holding a plan of name over dst
// and src makes before each run: it says, with ErrInvalid, whether one of
// them lies in a symmetric buffer that this rank has freed (or its group
// closed) since, its memory unmapped and a run bound to fault. It is nil
// where neither lies in a symmetric buffer. Whatever the engine (the
// node's group, or one across nodes whose node ops or own copy touch
// them), the run is then refused in step with the peers instead.
func (g *Group) FreedCheck(name string, dst, src []byte) func() error {
	sb, db := g.holder(src), g.holder(dst)
	if sb == nil && db == nil {
		return nil
	}
	rank := g.global(g.rank)
	return func() error {
		what := ""
		switch {
		case sb != nil && sb.bytes == nil:
			what = "source"
		case db != nil && db.bytes == nil:
			what = "destination"
		default:
			return nil
		}
		return fault.New(name, rank, -1, fault.ErrInvalid, "the %s lies in a symmetric buffer freed since the call was planned", what)
	}
}

// holder is the symmetric buffer that holds p on this rank, or nil.
func (g *Group) holder(p []byte) *Buffer {
	if id, _, ok := g.lookup(p); ok {
		return g.bufs[id]
	}
	return nil
}

// lookup finds the symmetric buffer that holds p on this rank.
func (g *Group) lookup(p []byte) (id, off int, ok bool) {
	if len(p) == 0 {
		return 0, 0, false
	}
	a := uintptr(unsafe.Pointer(&p[0]))
	for i, b := range g.bufs {
		if b == nil || len(b.bytes) == 0 {
			continue
		}
		base := uintptr(unsafe.Pointer(&b.seg.Mem[g.rank*b.stride]))
		if a >= base && a+uintptr(len(p)) <= base+uintptr(b.stride) {
			return i, int(a - base), true
		}
	}
	return 0, 0, false
}
