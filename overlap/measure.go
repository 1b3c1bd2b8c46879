package overlap

import (
	"context"
	"time"

	"github.com/slimego/slimego/collective"
)

// Times are the medians, over iterations, of the slowest rank's time of
// each way to compute C (µs), as ../shared/BENCH.md defines them.
type Times struct {
	Comm, GEMM, Seq, Overlap float64
}

// Efficiency is (t_seq − t_overlap) / min(t_comm, t_gemm): 1 when the
// shorter of the two is hidden entirely.
func (t Times) Efficiency() float64 {
	hide := min(t.Comm, t.GEMM)
	if hide <= 0 {
		return 0
	}
	return (t.Seq - t.Overlap) / hide
}

// Measure times o's gather alone, GEMM alone, both in sequence, and both
// overlapped, iters times each after one warm-up, with a barrier before
// each timed run. Every rank returns the same figures.
func Measure[T Float](ctx context.Context, c *collective.Communicator, o *Op[T], iters int) (Times, error) {
	ways := []func(context.Context) error{o.Gather, o.GEMM, o.RunSequential, o.Run}
	var out [4]float64
	per := make([]float64, iters)
	all := make([]float64, c.Size()*iters)
	for w, run := range ways {
		if err := run(ctx); err != nil { // warm-up
			return Times{}, err
		}
		for i := range per {
			if err := c.Barrier(ctx); err != nil {
				return Times{}, err
			}
			t0 := time.Now()
			if err := run(ctx); err != nil {
				return Times{}, err
			}
			per[i] = float64(time.Since(t0).Nanoseconds()) / 1e3
		}
		if err := collective.AllGatherOf(ctx, c, all, per); err != nil {
			return Times{}, err
		}
		slowest := make([]float64, iters)
		for i := range slowest {
			for r := range c.Size() {
				slowest[i] = max(slowest[i], all[r*iters+i])
			}
		}
		out[w] = median(slowest)
	}
	return Times{Comm: out[0], GEMM: out[1], Seq: out[2], Overlap: out[3]}, nil
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
