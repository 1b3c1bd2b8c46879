package overlap

import (
	"context"
	"time"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/internal/cpustat"
)

// Times are the medians, over iterations, of the slowest rank's time of
// each way to compute C (µs), as ../shared/BENCH.md defines them.
type Times struct {
	Comm, GEMM, Seq, Overlap float64
	// CommCPU and GEMMCPU are the fractions of the machine's processor
	// time busy while the gather, or the GEMMs, ran alone (MeasureCPU; 0
	// when not measured). On one machine that stands in for several nodes
	// they count every node's work. Busy is not all work: threads that
	// spin while they wait (OpenBLAS's, the Go scheduler's) count too, so
	// an overlapped run can take less of the machine than the two add up to.
	CommCPU, GEMMCPU float64
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

// MeasureCPU fills t.CommCPU and t.GEMMCPU: it runs o's gather alone back
// to back for about window (the count taken from t.Comm, so that every rank
// runs as many), then its GEMMs alone, and samples the machine's idle time
// around each. Every rank returns the busiest rank's figures: across
// nodes, the busiest node's. Where the platform does not tell idle time,
// t comes back unchanged.
func MeasureCPU(ctx context.Context, c *collective.Communicator, o Ways, t Times, window time.Duration) (Times, error) {
	busy := make([]float64, 2)
	for w, way := range []struct {
		run func(context.Context) error
		per float64
	}{{o.Gather, t.Comm}, {o.GEMM, t.GEMM}} {
		n := max(1, int(float64(window.Microseconds())/max(way.per, 1)))
		if err := c.Barrier(ctx); err != nil {
			return t, err
		}
		a, ok := cpustat.Now()
		for range n {
			if err := way.run(ctx); err != nil {
				return t, err
			}
		}
		b, _ := cpustat.Now()
		if ok {
			busy[w] = cpustat.Busy(a, b)
		}
	}
	all := make([]float64, 2*c.Size())
	if err := collective.AllGatherOf(ctx, c, all, busy); err != nil {
		return t, err
	}
	for r := range c.Size() {
		t.CommCPU, t.GEMMCPU = max(t.CommCPU, all[2*r]), max(t.GEMMCPU, all[2*r+1])
	}
	return t, nil
}

// Ways are the four ways an operator computes C, timed by Measure: the
// CPU's Op and the GPU's GPUOp.
type Ways interface {
	Gather(ctx context.Context) error        // the gather alone (t_comm)
	GEMM(ctx context.Context) error          // the GEMMs alone (t_gemm)
	RunSequential(ctx context.Context) error // one after the other (t_seq)
	Run(ctx context.Context) error           // overlapped (t_overlap)
}

// Measure times o's gather alone, GEMM alone, both in sequence, and both
// overlapped, with a barrier before each timed run. The four alternate
// within every iteration, so that a change in the machine's state touches
// them alike; there are at least minIters iterations and enough for each
// way to total about 0.2 s. Every rank returns the same figures.
func Measure(ctx context.Context, c *collective.Communicator, o Ways, minIters int) (Times, error) {
	ways := []func(context.Context) error{o.Gather, o.GEMM, o.RunSequential, o.Run}
	timeOne := func(run func(context.Context) error) (float64, error) {
		if err := c.Barrier(ctx); err != nil {
			return 0, err
		}
		t0 := time.Now()
		err := run(ctx)
		return float64(time.Since(t0).Nanoseconds()) / 1e3, err
	}
	// Warm-up, and from it an iteration count every rank agrees on.
	longest := make([]float64, 1)
	for _, run := range ways {
		t, err := timeOne(run)
		if err != nil {
			return Times{}, err
		}
		longest[0] = max(longest[0], t)
	}
	all := make([]float64, c.Size())
	if err := collective.AllGatherOf(ctx, c, all, longest); err != nil {
		return Times{}, err
	}
	slowestWarm := 0.0
	for _, t := range all {
		slowestWarm = max(slowestWarm, t)
	}
	iters := max(minIters, min(int(2e5/max(slowestWarm, 1)), 200))
	per := make([][]float64, len(ways))
	for w := range per {
		per[w] = make([]float64, iters)
	}
	for i := range iters {
		for w, run := range ways {
			t, err := timeOne(run)
			if err != nil {
				return Times{}, err
			}
			per[w][i] = t
		}
	}
	var out [4]float64
	gathered := make([]float64, c.Size()*iters)
	for w := range ways {
		if err := collective.AllGatherOf(ctx, c, gathered, per[w]); err != nil {
			return Times{}, err
		}
		slowest := make([]float64, iters)
		for i := range slowest {
			for r := range c.Size() {
				slowest[i] = max(slowest[i], gathered[r*iters+i])
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
