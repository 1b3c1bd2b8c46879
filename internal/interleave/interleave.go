// Package interleave times several ways of doing one thing on every rank
// of a communicator, the ways alternating within every iteration, so that
// a change in a shared, noisy machine's state touches them alike and their
// ratios compare moments milliseconds apart.
package interleave

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/slimego/slimego/collective"
)

// MaxIters is the most iterations Time runs, whatever the rule: the time
// rule's cap (bench.MaxIters). A Rule whose MinIters exceeds it is
// refused: its times alone would take gigabytes, its runs hours.
const MaxIters = 200_000

// Rule bounds the iterations: enough for the longest way to fill MinTime,
// at most MaxIters (0: the package's MaxIters), at least MinIters (and 1).
type Rule struct {
	MinIters, MaxIters int
	MinTime            time.Duration
}

// Time runs the ways with a barrier before each run: a round to warm up
// (fresh pages), two rounds from which the iteration count comes (each
// way's shorter run of the two, so that one run stretched by a
// retransmission timeout does not cut the count), then the timed
// iterations. It returns, for every way, each iteration's time (µs) on the
// slowest rank: the same figures on every rank.
func Time(ctx context.Context, c *collective.Communicator, ways []func(context.Context) error, rule Rule) ([][]float64, error) {
	if rule.MinIters > MaxIters {
		return nil, fmt.Errorf("interleave: rank %d: at least %d iterations: more than %d", c.Rank(), rule.MinIters, MaxIters)
	}
	timeOne := func(run func(context.Context) error) (float64, error) {
		if err := c.Barrier(ctx); err != nil {
			return 0, err
		}
		t0 := time.Now()
		err := run(ctx)
		return float64(time.Since(t0).Nanoseconds()) / 1e3, err
	}
	first := make([]float64, len(ways))
	est := []float64{0}
	for round := range 3 {
		for w, run := range ways {
			t, err := timeOne(run)
			if err != nil {
				return nil, err
			}
			switch round {
			case 1:
				first[w] = t
			case 2:
				est[0] = max(est[0], min(first[w], t))
			}
		}
	}
	all := make([]float64, c.Size())
	if err := collective.AllGatherOf(ctx, c, all, est); err != nil {
		return nil, err
	}
	longest := max(slices.Max(all), 1)
	iters := int(float64(rule.MinTime.Microseconds()) / longest)
	if rule.MaxIters > 0 {
		iters = min(iters, rule.MaxIters)
	}
	iters = min(iters, MaxIters)
	iters = max(iters, rule.MinIters, 1)
	// times[w*iters+i]: way w, iteration i.
	times := make([]float64, len(ways)*iters)
	for i := range iters {
		for w, run := range ways {
			t, err := timeOne(run)
			if err != nil {
				return nil, err
			}
			times[w*iters+i] = t
		}
	}
	everyone := make([]float64, c.Size()*len(times))
	if err := collective.AllGatherOf(ctx, c, everyone, times); err != nil {
		return nil, err
	}
	out := make([][]float64, len(ways))
	for w := range ways {
		out[w] = make([]float64, iters)
		for i := range iters {
			for r := range c.Size() {
				out[w][i] = max(out[w][i], everyone[r*len(times)+w*iters+i])
			}
		}
	}
	return out, nil
}

// Median is the median of xs, which it leaves as they are.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
