package bench

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/internal/interleave"
	"github.com/slimego/slimego/internal/pattern"
)

// LinkResult sets the all-gather beside the link it runs over, at one
// per-rank size S, between two ranks on two nodes.
type LinkResult struct {
	S int64
	// Link is the median time (µs) of one duplex transfer of S bytes each
	// way on plain sockets (what TCP measures with duplex); Out and In
	// those of the all-gather out of place and in place.
	Link, Out, In float64
	// RatioOut and RatioIn are the medians over iterations of the link's
	// time over the all-gather's in the same iteration: busbw as a
	// fraction of the link's bandwidth (for two ranks busbw = S / t).
	RatioOut, RatioIn float64
	Iters             int
	// Wrong and WrongIn are the bytes wrong in the check of the
	// all-gather out of place and in place, in every rank's destination.
	Wrong, WrongIn int64
}

// LinkGBps is the link's bandwidth per direction.
func (r LinkResult) LinkGBps() float64 { return gbps(r.S, r.Link) }

// BusBW is the all-gather's busbw, out of place or in place.
func (r LinkResult) BusBW(inPlace bool) float64 {
	if inPlace {
		return gbps(r.S, r.In)
	}
	return gbps(r.S, r.Out)
}

func gbps(n int64, us float64) float64 {
	if us <= 0 {
		return 0
	}
	return float64(n) / (us * 1e-6) / 1e9
}

// Link times c's all-gather (symmetric buffers, out of place and in place)
// and a duplex transfer of the same size on plain TCP connections between
// the same two ranks, alternating within every iteration (link, out of
// place, link, in place), so that each ratio compares moments a few
// milliseconds apart. On a shared, noisy machine, where the link's
// bandwidth moves by tens of percent from one minute to the next, that is
// the comparison that holds. channels and lowat set up the plain
// connections as the transport's are (inter.DefaultChannels,
// inter.DefaultLowat); iterations are at least minIters and enough to fill
// minTime per way. Every rank returns the same figures.
func Link(ctx context.Context, c *collective.Communicator, masterAddr string, sizes []int64, channels, lowat, minIters int, minTime time.Duration, progress func(done, total int, r LinkResult)) ([]LinkResult, error) {
	l, err := openLink(ctx, c, masterAddr, channels, lowat)
	if err != nil {
		return nil, err
	}
	defer l.close()
	var out []LinkResult
	for i, n := range sizes {
		r, err := linkSize(ctx, c, l, int(n), max(minIters, 1), minTime)
		if err != nil {
			return out, fmt.Errorf("bench: link at %d bytes: %w", n, err)
		}
		out = append(out, r)
		if progress != nil && c.Rank() == 0 {
			progress(i+1, len(sizes), r)
		}
	}
	return out, nil
}

func linkSize(ctx context.Context, c *collective.Communicator, l *link, n, minIters int, minTime time.Duration) (LinkResult, error) {
	me := c.Rank()
	res := LinkResult{S: int64(n)}
	dst, src, free, err := buffers(ctx, c, n, false, true)
	if err != nil {
		return res, err
	}
	defer free()
	planOut, err := c.Plan(dst, src)
	if err != nil {
		return res, err
	}
	planIn, err := c.Plan(dst, dst[me*n:me*n+n])
	if err != nil {
		return res, err
	}
	// The link carries random bytes too, though it checks nothing.
	send, recv := make([]byte, n), make([]byte, n)
	pattern.Fill(send, pattern.Seed(me, 2, uint64(n)))
	// Each placement is checked before the timed calls and again after
	// them, on another round's data (a gather right on its first call and
	// wrong on later ones leaves round 1's bytes), as the all-gather sweep
	// checks (oneSize): the count is the larger of the two, each byte of
	// the destination counted once.
	checked := [2]func(context.Context) error{planOut.Run, planIn.Run}
	if testHookLinkCheck != nil {
		checked[0] = testHookLinkCheck(false, dst, checked[0])
		checked[1] = testHookLinkCheck(true, dst, checked[1])
	}
	check := func(round int) error {
		for i, inPlace := range []bool{false, true} {
			pattern.Fill(dst, 0xdead)
			blk := src
			if inPlace {
				blk = dst[me*n : me*n+n]
			}
			pattern.Fill(blk, pattern.Seed(me, round, uint64(n)))
			if err := checked[i](ctx); err != nil {
				return err
			}
			w := countWrong(dst, 2, n, round)
			if inPlace {
				res.WrongIn = max(res.WrongIn, w)
			} else {
				res.Wrong = max(res.Wrong, w)
			}
		}
		return nil
	}
	if err := check(1); err != nil {
		return res, err
	}
	// Each all-gather's ratio is to the duplex transfer just before it,
	// the nearest moment of the link, and follows the same work.
	duplex := func(context.Context) error { return l.duplex(send, recv) }
	ways := []func(context.Context) error{duplex, planOut.Run, duplex, planIn.Run}
	per, err := interleave.Time(ctx, c, ways, interleave.Rule{MinIters: minIters, MaxIters: 1000, MinTime: minTime})
	if err != nil {
		return res, err
	}
	// The link's time over the all-gather's that followed it, iteration
	// by iteration.
	ratio := func(w int) float64 {
		rs := make([]float64, len(per[w]))
		for i := range rs {
			rs[i] = per[w-1][i] / per[w][i]
		}
		return interleave.Median(rs)
	}
	m := interleave.Median
	res.RatioOut, res.RatioIn = ratio(1), ratio(3)
	res.Link, res.Out, res.In = m(slices.Concat(per[0], per[2])), m(per[1]), m(per[3])
	res.Iters = len(per[0])
	if err := check(2); err != nil {
		return res, err
	}
	// Every rank's wrong bytes, each rank's destination counted once.
	wrongs := make([]int64, 2*c.Size())
	if err := collective.AllGatherOf(ctx, c, wrongs, []int64{res.Wrong, res.WrongIn}); err != nil {
		return res, err
	}
	res.Wrong, res.WrongIn = 0, 0
	for r := range c.Size() {
		res.Wrong += wrongs[2*r]
		res.WrongIn += wrongs[2*r+1]
	}
	return res, nil
}

// testHookLinkCheck, set by tests, wraps the all-gather that Link checks,
// out of place or in place, whose destination on this rank is dst (to
// make one of them fail as a broken one would).
var testHookLinkCheck func(inPlace bool, dst []byte, run func(context.Context) error) func(context.Context) error
