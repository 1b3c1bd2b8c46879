package bench

import (
	"bytes"
	"cmp"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/slimego/slimego/internal/bytesize"
)

// CSVHeader is the column list of docs/BENCHMARKS.md.
var CSVHeader = []string{"impl", "backend", "mode", "P", "nodes", "S", "median_us", "algbw_GBps", "busbw_GBps", "wrong"}

// implName tells in-place rows apart in CSV and JSON.
func (r Result) implName() string {
	if r.InPlace {
		return r.Impl + "/in-place"
	}
	return r.Impl
}

// WriteCSV writes rs with CSVHeader.
func WriteCSV(w io.Writer, rs []Result) error {
	cw := csv.NewWriter(w)
	cw.Write(CSVHeader)
	for _, r := range rs {
		cw.Write(r.fields())
	}
	cw.Flush()
	return cw.Error()
}

// fields is r's CSV line, in CSVHeader's order.
func (r Result) fields() []string {
	return []string{r.implName(), r.Backend, r.Mode, strconv.Itoa(r.P), strconv.Itoa(r.Nodes),
		strconv.FormatInt(r.S, 10), ff(r.Median, 3), ff(r.AlgBW, 4), ff(r.BusBW, 4), r.wrongField("")}
}

// wrongField is r's wrong count, or none where r checks nothing.
func (r Result) wrongField(none string) string {
	if r.Unchecked {
		return none
	}
	return strconv.FormatInt(r.Wrong, 10)
}

func ff(x float64, prec int) string { return strconv.FormatFloat(x, 'f', prec, 64) }

// ReadCSV reads what WriteCSV (or the OpenMPI and Gloo programs under
// bench/) wrote.
func ReadCSV(r io.Reader) ([]Result, error) {
	rows, err := csv.NewReader(r).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("bench: csv: %w", err)
	}
	if len(rows) == 0 || strings.Join(rows[0], ",") != strings.Join(CSVHeader, ",") {
		return nil, fmt.Errorf("bench: csv: header is not %s", strings.Join(CSVHeader, ","))
	}
	var out []Result
	for i, row := range rows[1:] {
		var r Result
		var errs [7]error
		r.Impl, r.Backend, r.Mode = row[0], row[1], row[2]
		r.P, errs[0] = strconv.Atoi(row[3])
		r.Nodes, errs[1] = strconv.Atoi(row[4])
		r.S, errs[2] = strconv.ParseInt(row[5], 10, 64)
		r.Median, errs[3] = strconv.ParseFloat(row[6], 64)
		r.AlgBW, errs[4] = strconv.ParseFloat(row[7], 64)
		r.BusBW, errs[5] = strconv.ParseFloat(row[8], 64)
		if row[9] == "" { // a row that checks nothing
			r.Unchecked = true
		} else {
			r.Wrong, errs[6] = strconv.ParseInt(row[9], 10, 64)
		}
		for _, e := range errs {
			if e != nil {
				return nil, fmt.Errorf("bench: csv line %d: %w", i+2, e)
			}
		}
		if base, ok := strings.CutSuffix(r.Impl, "/in-place"); ok {
			r.Impl, r.InPlace = base, true
		}
		out = append(out, r)
	}
	return out, nil
}

// WriteJSON writes rs as a JSON array of objects, one a row, with the
// CSV's columns as keys in the CSV's order and its values (the text ones
// as strings, the others as numbers; an empty wrong, a row that checks
// nothing, and a figure JSON cannot write, NaN or infinite, as null).
func WriteJSON(w io.Writer, rs []Result) error {
	var b bytes.Buffer
	b.WriteString("[")
	for i, r := range rs {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString("\n  {")
		for j, v := range r.fields() {
			if j > 0 {
				b.WriteString(",")
			}
			key, _ := json.Marshal(CSVHeader[j])
			fmt.Fprintf(&b, "\n    %s: ", key)
			switch {
			case j < 3: // impl, backend, mode
				text, _ := json.Marshal(v)
				b.Write(text)
			default:
				if x, err := strconv.ParseFloat(v, 64); err != nil || math.IsNaN(x) || math.IsInf(x, 0) {
					v = "null" // none (wrong, unchecked), or no number JSON has
				}
				b.WriteString(v)
			}
		}
		b.WriteString("\n  }")
	}
	if len(rs) > 0 {
		b.WriteString("\n")
	}
	b.WriteString("]\n")
	_, err := w.Write(b.Bytes())
	return err
}

// WriteTable writes nccl-tests' layout: one line per size, out-of-place
// then in-place columns (size count type time algbw busbw #wrong). A table
// with any emulated figure (backend EmulatedBackend) says so under its
// title, whatever the title says.
func WriteTable(w io.Writer, rs []Result, title string) {
	fmt.Fprintf(w, "# %s\n", title)
	if slices.ContainsFunc(rs, func(r Result) bool { return r.Backend == EmulatedBackend }) {
		fmt.Fprintf(w, "# %s\n", EmulatedNote)
	}
	fmt.Fprintf(w, "# size: bytes each rank contributes; time: median over iterations of the slowest rank, µs\n")
	fmt.Fprintf(w, "#%43s%s%s\n", "", center("out-of-place", 34), center("in-place", 34))
	fmt.Fprintf(w, "#%12s %12s %8s   %9s %7s %7s %6s   %9s %7s %7s %6s\n", "size", "count", "type", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong")
	fmt.Fprintf(w, "#%12s %12s %8s   %9s %7s %7s %6s   %9s %7s %7s %6s\n", "(B)", "(elements)", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "")
	var wrong int64
	var busSum float64
	var busN int
	for i := 0; i < len(rs); i++ {
		out := rs[i]
		in, hasIn := Result{}, false
		if i+1 < len(rs) && rs[i+1].InPlace && rs[i+1].S == out.S {
			in, hasIn = rs[i+1], true
			i++
		}
		fmt.Fprintf(w, " %12d %12d %8s   %s", out.S, out.S, "uint8", cols(out))
		if hasIn {
			fmt.Fprintf(w, "   %s", cols(in))
			wrong += in.Wrong
		}
		fmt.Fprintln(w)
		wrong += out.Wrong
		busSum += out.BusBW
		busN++
	}
	if busN > 0 {
		fmt.Fprintf(w, "# Out of bounds values : %d %s\n", wrong, map[bool]string{true: "OK", false: "FAILED"}[wrong == 0])
		fmt.Fprintf(w, "# Avg bus bandwidth    : %.4f GB/s (out-of-place)\n", busSum/float64(busN))
	}
}

func cols(r Result) string {
	return fmt.Sprintf("%9.2f %7.3f %7.3f %6s", r.Median, r.AlgBW, r.BusBW, r.wrongField("-"))
}

func center(s string, w int) string {
	pad := (w - len(s)) / 2
	return strings.Repeat(" ", max(pad, 0)) + s + strings.Repeat(" ", max(w-len(s)-pad, 0))
}

// ByImpl splits rows by implementation, in the order each first appears:
// one CSV may hold several (slimego's rows and Config.Ceiling's).
func ByImpl(rs []Result) [][]Result {
	var out [][]Result
	at := map[string]int{}
	for _, r := range rs {
		i, ok := at[r.Impl]
		if !ok {
			i = len(out)
			at[r.Impl] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], r)
	}
	return out
}

// MergeAlong combines repeated runs of an implementation measured in
// the same runs as another, host: other[i] and host[i] come from one run.
// For each (P, S, placement) it takes other's row from the run whose host
// row is the median one (with an even count, the upper middle, as
// Merge), so that a ratio of the two compares rows of one moment; rows
// that host lacks are merged as Merge does.
func MergeAlong(host, other [][]Result) []Result {
	if len(other) == 0 || len(host) != len(other) {
		return Merge(other...)
	}
	find := func(run []Result, r Result) (Result, bool) {
		for _, o := range run {
			if o.P == r.P && o.S == r.S && o.InPlace == r.InPlace {
				return o, true
			}
		}
		return Result{}, false
	}
	merged := Merge(other...) // row by row as other[0]'s
	var out []Result
	for k, r := range other[0] {
		var at []int // runs that have the row in both
		for i := range other {
			_, okH := find(host[i], r)
			_, okO := find(other[i], r)
			if okH && okO {
				at = append(at, i)
			}
		}
		if len(at) < len(other) {
			out = append(out, merged[k])
			continue
		}
		slices.SortStableFunc(at, func(a, b int) int {
			ha, _ := find(host[a], r)
			hb, _ := find(host[b], r)
			return cmp.Compare(ha.Median, hb.Median)
		})
		m, _ := find(other[at[len(at)/2]], r)
		for _, i := range at {
			o, _ := find(other[i], r)
			m.Wrong = max(m.Wrong, o.Wrong)
			m.Unchecked = m.Unchecked && o.Unchecked
		}
		out = append(out, m)
	}
	return out
}

// Merge combines repeated runs of one implementation: for each (P, S,
// placement) the row with the median time across runs. Runs interleaved
// with other implementations' (A B A B A B) make a comparison that a
// passing change in the machine's state does not decide.
func Merge(runs ...[]Result) []Result {
	if len(runs) == 0 {
		return nil
	}
	var out []Result
	for _, r := range runs[0] {
		var same []Result
		for _, run := range runs {
			for _, o := range run {
				if o.P == r.P && o.S == r.S && o.InPlace == r.InPlace {
					same = append(same, o)
					break
				}
			}
		}
		slices.SortFunc(same, func(a, b Result) int { return cmp.Compare(a.Median, b.Median) })
		m := same[len(same)/2]
		for _, o := range same {
			m.Wrong = max(m.Wrong, o.Wrong)
			m.Unchecked = m.Unchecked && o.Unchecked
		}
		out = append(out, m)
	}
	return out
}

// Compare writes one line per row of base (a size, out of place or in
// place) with its time and busbw, and beside it each other set's matching
// row (same P, S and placement) with the ratio of times: other / base,
// above 1 when base is faster.
// Comparable says whether rows a and b measure the same thing, the rows
// Compare sets side by side: the same P, size and placement.
func Comparable(a, b Result) bool { return a.S == b.S && a.InPlace == b.InPlace && a.P == b.P }

func Compare(w io.Writer, base []Result, others ...[]Result) {
	name := func(rs []Result) string {
		if len(rs) == 0 {
			return "?"
		}
		return rs[0].Impl
	}
	fmt.Fprintf(w, "%-6s %-12s %22s", "", "", name(base))
	for _, o := range others {
		fmt.Fprintf(w, " | %30s", name(o))
	}
	fmt.Fprintf(w, "\n%-6s %-12s %11s %10s", "size", "placement", "time(us)", "busbw")
	for range others {
		fmt.Fprintf(w, " | %11s %10s %7s", "time(us)", "busbw", "ratio")
	}
	fmt.Fprintln(w)
	for _, b := range base {
		place := "out-of-place"
		if b.InPlace {
			place = "in-place"
		}
		fmt.Fprintf(w, "%-6s %-12s %11.2f %10.3f", bytesize.Format(b.S), place, b.Median, b.BusBW)
		for _, os := range others {
			found := false
			for _, o := range os {
				if Comparable(o, b) {
					fmt.Fprintf(w, " | %11.2f %10.3f %6.2fx", o.Median, o.BusBW, o.Median/b.Median)
					found = true
					break
				}
			}
			if !found {
				fmt.Fprintf(w, " | %11s %10s %7s", "-", "-", "-")
			}
		}
		fmt.Fprintln(w)
	}
}
