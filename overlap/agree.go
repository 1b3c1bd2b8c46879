package overlap

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/internal/verdict"
)

// What the ranks compare at New. The gather's plans agree between ranks on
// byte counts alone: two ranks that cut their blocks differently (m = 4,
// k = 8 against m = 8, k = 4) move the same bytes and would multiply
// misread rows without an error, and ranks that cut the gather into a
// different number of pieces (m = 0 plans none) would pair one rank's
// piece with another's next call. So New exchanges, once, a fixed record
// of what each rank planned, in one all-gather of the same size on every
// rank whatever it planned, refused shapes included, and every rank
// returns the same verdict.

// The fields of a plan record, each an int64, little-endian.
const (
	recRefused = iota // 1 where the rank refused its own shape (checkShape)
	recM
	recN
	recK
	recEsz
	recPieces
	recFields
)

// planned is what one rank passed to NewWith, and how many pieces it cut
// the gather into.
type planned struct{ m, n, k, esz, pieces int }

// agree compares, across the ranks of c, what each planned (mine), or
// refused (bad, this rank's own ErrInvalid from checkShape): a collective
// call that every rank makes once in NewWith, bounded by the
// communicator's timeout. It returns nil where every rank planned the
// same m, k, element size and number of pieces; bad where this rank
// refused its shape; ErrInvalid naming the first other rank that refused
// its own; ErrSizeMismatch naming a rank whose plan differs, and what
// differs, otherwise. n is not compared: B and C are each rank's own, and
// the gather does not depend on them. Where the exchange itself fails (a
// peer gone, the timeout), its error, which names the peer, is returned.
func agree(ctx context.Context, c *collective.Communicator, mine planned, bad error) error {
	P, me := c.Size(), c.Rank()
	src := make([]byte, recFields*8)
	refused := 0
	if bad != nil {
		refused = 1
	}
	for i, v := range [recFields]int{recRefused: refused, recM: mine.m, recN: mine.n, recK: mine.k, recEsz: mine.esz, recPieces: mine.pieces} {
		binary.LittleEndian.PutUint64(src[i*8:], uint64(v))
	}
	dst := make([]byte, P*len(src))
	err := c.AllGather(ctx, dst, src)
	if bad != nil {
		return bad
	}
	if err != nil {
		return err
	}
	recs := make([]planned, P)
	var refusers []int
	for r := range recs {
		f := func(i int) int { return int(int64(binary.LittleEndian.Uint64(dst[(r*recFields+i)*8:]))) }
		recs[r] = planned{m: f(recM), n: f(recN), k: f(recK), esz: f(recEsz), pieces: f(recPieces)}
		if f(recRefused) != 0 {
			refusers = append(refusers, r)
		}
	}
	if len(refusers) > 0 {
		r := refusers[0]
		p := recs[r]
		return &collective.OpError{Op: "overlap-plan", Rank: me, Peer: r, Err: collective.ErrInvalid,
			Detail: fmt.Sprintf("%s refused %s overlap plan as invalid (rank %d: shape %d×%d×%d of %d-byte elements on %d ranks: %s); no rank planned",
				verdict.RankList(refusers), map[bool]string{true: "its", false: "their"}[len(refusers) == 1], r, p.m, p.n, p.k, p.esz, P, shapeFault(P, p.m, p.n, p.k, p.esz))}
	}
	if peer, detail := differs(recs, me); peer >= 0 {
		return &collective.OpError{Op: "overlap-plan", Rank: me, Peer: peer, Err: collective.ErrSizeMismatch,
			Detail: detail + "; the ranks' overlap plans differ"}
	}
	return nil
}

// same is whether two plans gather alike (n aside).
func same(a, b planned) bool {
	return a.m == b.m && a.k == b.k && a.esz == b.esz && a.pieces == b.pieces
}

// differs describes how the ranks' plans differ, in the same words on
// every rank: the ranks are grouped by plan; the group with more ranks than
// any other is the reference (without one, rank 0's), and each other group
// is described against it. peer is the first rank of the first other
// group, or, on that rank, the reference's first rank; -1 where every
// plan agrees.
func differs(recs []planned, me int) (peer int, detail string) {
	return verdict.Differs(recs, me, same, func(p planned, g []int, rp planned, rr []int) string {
		var what []string
		for _, d := range []struct {
			name string
			a, b int
		}{{"m", p.m, rp.m}, {"k", p.k, rp.k}, {"the element size", p.esz, rp.esz}, {"the number of pieces", p.pieces, rp.pieces}} {
			if d.a != d.b {
				what = append(what, d.name)
			}
		}
		differ, plan := "differs", "plans"
		if len(what) > 1 {
			differ = "differ"
		}
		if len(g) > 1 {
			plan = "plan"
		}
		return fmt.Sprintf("%s %s: %s %s %s, %s %s",
			verdict.AndList(what), differ, verdict.RankList(g), plan, describe(p), verdict.RankList(rr), describe(rp))
	})
}

// describe is "m=4 k=8 of 4-byte elements in 4 pieces".
func describe(p planned) string {
	return fmt.Sprintf("m=%d k=%d of %d-byte elements in %d pieces", p.m, p.k, p.esz, p.pieces)
}
