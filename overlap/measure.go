package overlap

import (
	"context"
	"time"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/internal/cpustat"
	"github.com/slimego/slimego/internal/interleave"
)

// Times are the medians, over iterations, of the slowest rank's time of
// each way to compute C (µs), as docs/BENCHMARKS.md defines them.
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

// NoisyShare is the share of t_seq below which min(t_comm, t_gemm), the
// most overlap can hide, makes the efficiency mostly noise: a 1% change in
// t_seq or t_overlap then moves it by more than 0.1.
const NoisyShare = 0.1

// Noisy says whether t's efficiency is mostly noise (NoisyShare): a
// report marks it so rather than print 3.2 or −2.3 as overlap.
func (t Times) Noisy() bool { return t.Seq > 0 && min(t.Comm, t.GEMM) < NoisyShare*t.Seq }

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
// around each. Before the gather's sample it runs the gather unsampled for
// about CPUSettle, so that threads still spinning after the GEMMs that ran
// before (OpenBLAS's wait that long) are not counted as the gather's. Every
// rank returns the busiest rank's figures: across nodes, the busiest
// node's. Where the platform does not tell idle time, t comes back
// unchanged.
func MeasureCPU(ctx context.Context, c *collective.Communicator, o Ways, t Times, window time.Duration) (Times, error) {
	busy := make([]float64, 2)
	for w, way := range []struct {
		run func(context.Context) error
		per float64
	}{{o.Gather, t.Comm}, {o.GEMM, t.GEMM}} {
		// runFor runs the way back to back for about d, at least once.
		runFor := func(d time.Duration) error {
			for range max(1, int(float64(d.Microseconds())/max(way.per, 1))) {
				if err := way.run(ctx); err != nil {
					return err
				}
			}
			return nil
		}
		if err := c.Barrier(ctx); err != nil {
			return t, err
		}
		if w == 0 { // the gather: let the GEMMs' spinning threads settle
			if err := runFor(CPUSettle); err != nil {
				return t, err
			}
		}
		a, ok := cpustat.Now()
		if err := runFor(window); err != nil {
			return t, err
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

// CPUSettle is how long MeasureCPU runs the gather before it samples it:
// OpenBLAS's idle threads spin for about 0.1 s (2^28 cycles) after a GEMM.
const CPUSettle = 200 * time.Millisecond

// Ways are the four ways an operator computes C, timed by Measure: an Op
// on either backend.
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
	per, err := interleave.Time(ctx, c, []func(context.Context) error{o.Gather, o.GEMM, o.RunSequential, o.Run},
		interleave.Rule{MinIters: minIters, MaxIters: 200, MinTime: 200 * time.Millisecond})
	if err != nil {
		return Times{}, err
	}
	m := interleave.Median
	return Times{Comm: m(per[0]), GEMM: m(per[1]), Seq: m(per[2]), Overlap: m(per[3])}, nil
}
