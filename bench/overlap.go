package bench

import (
	"encoding/csv"
	"fmt"
	"io"
	"sort"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/slimego/slimego/overlap"
)

// OverlapResult is one shape of the AllGather+GEMM sweep.
type OverlapResult struct {
	Impl, Backend, Mode string
	P, M, N, K          int
	Dtype               string
	Pieces              int     // the gather's pieces (the operator may cut fewer than asked)
	Comm, GEMM          float64 // µs
	Seq, Overlap        float64 // µs
	Efficiency          float64
	// CommCPU and GEMMCPU are the machine's busy fractions while the
	// gather, or the GEMMs, ran alone (overlap.Times); 0 when not measured.
	CommCPU, GEMMCPU float64
}

// noisyShare is overlap.NoisyShare, the rule the table's mark follows.
const noisyShare = overlap.NoisyShare

// NoisyRows says, one line each, which of rs have an efficiency that is
// mostly noise (overlap.Times.Noisy): the CSV's columns are BENCHMARKS.md's,
// so a CSV's reader learns it beside the rows (on stderr), as the table's
// reader does from its '*'.
func NoisyRows(rs []OverlapResult) []string {
	var out []string
	for _, r := range rs {
		if r.noisy() {
			out = append(out, fmt.Sprintf("noise: m=%d n=%d k=%d %s: efficiency %.3f, min(t_comm, t_gemm) under %.0f%% of t_seq", r.M, r.N, r.K, r.Dtype, r.Efficiency, 100*noisyShare))
		}
	}
	return out
}

// noisy says whether r's efficiency is mostly noise (overlap.Times.Noisy).
func (r OverlapResult) noisy() bool {
	return overlap.Times{Comm: r.Comm, GEMM: r.GEMM, Seq: r.Seq}.Noisy()
}

// OverlapCSVHeader is docs/BENCHMARKS.md's column list.
var OverlapCSVHeader = []string{"impl", "backend", "mode", "P", "m", "n", "k", "dtype", "t_comm_us", "t_gemm_us", "t_seq_us", "t_overlap_us", "efficiency"}

// WriteOverlapCSV writes rs with OverlapCSVHeader.
func WriteOverlapCSV(w io.Writer, rs []OverlapResult) error {
	cw := csv.NewWriter(w)
	cw.Write(OverlapCSVHeader)
	for _, r := range rs {
		cw.Write([]string{r.Impl, r.Backend, r.Mode, strconv.Itoa(r.P), strconv.Itoa(r.M), strconv.Itoa(r.N), strconv.Itoa(r.K), r.Dtype,
			ff(r.Comm, 1), ff(r.GEMM, 1), ff(r.Seq, 1), ff(r.Overlap, 1), ff(r.Efficiency, 3)})
	}
	cw.Flush()
	return cw.Error()
}

// WriteOverlapTable writes rs for people.
func WriteOverlapTable(w io.Writer, rs []OverlapResult, title string) {
	cpu := false
	for _, r := range rs {
		cpu = cpu || r.CommCPU > 0 || r.GEMMCPU > 0
	}
	fmt.Fprintf(w, "# %s\n# times: median over iterations of the slowest rank, µs; efficiency = (t_seq − t_overlap) / min(t_comm, t_gemm)\n", title)
	noisy := false
	for _, r := range rs {
		noisy = noisy || r.noisy()
	}
	if noisy {
		fmt.Fprintf(w, "# *: min(t_comm, t_gemm) is under %.0f%% of t_seq: a 1%% change in t_seq or t_overlap moves the efficiency by more than 0.1 (noise, not overlap)\n", 100*noisyShare)
	}
	if cpu {
		fmt.Fprintf(w, "# cpu_comm, cpu_gemm: the fraction of the machine's processor time busy while the gather, or the GEMMs, ran alone\n"+
			"# (spinning waits count as busy)\n")
	}
	fmt.Fprintf(w, "#%6s %6s %6s %8s %6s %12s %12s %12s %12s %10s", "m", "n", "k", "dtype", "pieces", "t_comm", "t_gemm", "t_seq", "t_overlap", "efficiency")
	if cpu {
		fmt.Fprintf(w, " %9s %9s", "cpu_comm", "cpu_gemm")
	}
	fmt.Fprintln(w)
	for _, r := range rs {
		fmt.Fprintf(w, " %6d %6d %6d %8s %6d %12.1f %12.1f %12.1f %12.1f %10.3f", r.M, r.N, r.K, r.Dtype, r.Pieces, r.Comm, r.GEMM, r.Seq, r.Overlap, r.Efficiency)
		if cpu {
			fmt.Fprintf(w, " %9.2f %9.2f", r.CommCPU, r.GEMMCPU)
		}
		if r.noisy() {
			fmt.Fprint(w, " *")
		}
		fmt.Fprintln(w)
	}
}

// PlotOverlap draws efficiency against m (rows per rank), one line per
// (n, k, dtype), into a PNG.
func PlotOverlap(rs []OverlapResult, title, file string) error {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(9)
	p.X.Label.Text = "m (rows of A per rank)"
	p.Y.Label.Text = "overlap efficiency"
	p.X.Scale = plot.LogScale{}
	// A tick at every m measured, and the efficiency's natural range, 0
	// (nothing hidden) to 1 (all of the shorter part hidden), widened to
	// what was measured.
	var ticks []plot.Tick
	seen := map[int]bool{}
	p.Y.Min, p.Y.Max = 0, 1
	for _, r := range rs {
		if !seen[r.M] {
			seen[r.M] = true
			ticks = append(ticks, plot.Tick{Value: float64(r.M), Label: strconv.Itoa(r.M)})
		}
		p.Y.Min, p.Y.Max = min(p.Y.Min, r.Efficiency), max(p.Y.Max, r.Efficiency)
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	series := map[string]plotter.XYs{}
	for _, r := range rs {
		key := fmt.Sprintf("n=k=%d %s", r.N, r.Dtype)
		if r.N != r.K {
			key = fmt.Sprintf("n=%d k=%d %s", r.N, r.K, r.Dtype)
		}
		series[key] = append(series[key], plotter.XY{X: float64(r.M), Y: r.Efficiency})
	}
	keys := make([]string, 0, len(series))
	for k := range series {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var args []any
	for _, k := range keys {
		args = append(args, k, series[k])
	}
	if err := plotutil.AddLinePoints(p, args...); err != nil {
		return err
	}
	return p.Save(6*vg.Inch, 4*vg.Inch, file)
}
