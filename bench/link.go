package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/slimego/slimego/collective"
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
	Wrong             int64 // bytes wrong in the all-gathers' check
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
// the same two ranks, with the three alternating within every iteration,
// so that each ratio compares moments a few milliseconds apart. On a
// shared, noisy machine, where the link's bandwidth moves by tens of
// percent from one minute to the next, that is the comparison that holds.
// channels and lowat set up the plain connections as the transport's are
// (inter.DefaultChannels, inter.DefaultLowat); iterations are at least
// minIters and enough to fill minTime per way. Every rank returns the same
// figures.
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
	for _, inPlace := range []bool{false, true} {
		pattern.Fill(dst, 0xdead)
		blk, run := src, planOut.Run
		if inPlace {
			blk, run = dst[me*n:me*n+n], planIn.Run
		}
		pattern.Fill(blk, pattern.Seed(me, 1, uint64(n)))
		if err := run(ctx); err != nil {
			return res, err
		}
		res.Wrong += countWrong(dst, 2, n)
	}
	ways := []func(context.Context) error{
		func(context.Context) error { return l.duplex(send, recv) },
		planOut.Run,
		planIn.Run,
	}
	times := make([]float64, len(ways))
	timeOne := func(run func(context.Context) error) (float64, error) {
		if err := c.Barrier(ctx); err != nil {
			return 0, err
		}
		t0 := time.Now()
		err := run(ctx)
		return float64(time.Since(t0).Nanoseconds()) / 1e3, err
	}
	// Warm-up (the first round touches fresh pages), and from the shorter
	// of the next two rounds' runs of each way (a retransmission timeout
	// stretches a run by 200 ms or more now and then) an iteration count
	// both ranks agree on.
	est := []float64{0}
	for round := range 3 {
		for w, run := range ways {
			t, err := timeOne(run)
			if err != nil {
				return res, err
			}
			if round == 1 {
				times[w] = t
			} else if round == 2 {
				est[0] = max(est[0], min(times[w], t))
			}
		}
	}
	both := make([]float64, 2)
	if err := collective.AllGatherOf(ctx, c, both, est); err != nil {
		return res, err
	}
	iters := min(max(minIters, int(float64(minTime.Microseconds())/max(both[0], both[1], 1))), 1000)
	// times[w*iters+i]: way w, iteration i.
	times = make([]float64, len(ways)*iters)
	for i := range iters {
		for w, run := range ways {
			t, err := timeOne(run)
			if err != nil {
				return res, err
			}
			times[w*iters+i] = t
		}
	}
	all := make([]float64, 2*len(times))
	if err := collective.AllGatherOf(ctx, c, all, times); err != nil {
		return res, err
	}
	// The slower rank's time of each iteration of each way.
	for i := range times {
		times[i] = max(all[i], all[len(times)+i])
	}
	way := func(w int) []float64 { return times[w*iters : (w+1)*iters] }
	ratios := func(w int) float64 {
		rs := make([]float64, iters)
		for i := range rs {
			rs[i] = way(0)[i] / way(w)[i]
		}
		return Median(rs)
	}
	res.RatioOut, res.RatioIn = ratios(1), ratios(2)
	res.Link, res.Out, res.In = Median(way(0)), Median(way(1)), Median(way(2))
	res.Iters = iters
	return res, nil
}
