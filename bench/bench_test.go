package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/testranks"
)

// TestAllGatherEveryBackend runs the sweep's one code path on host memory
// (symmetric and plain) and on the GPU's (graph and eager, on the
// emulator): every byte arrives right, every size is timed, and the row
// says where it ran.
func TestAllGatherEveryBackend(t *testing.T) {
	for _, tc := range []struct {
		name      string
		backend   device.Kind
		eager     bool
		symmetric bool
		wantBack  string
		wantMode  string
	}{
		{"cpu/symmetric", device.CPU, false, true, "cpu", "intra"},
		{"cpu/plain", device.CPU, false, false, "cpu", "intra"},
		{"cuda/graph", device.CUDA, false, false, EmulatedBackend, "intra/graph"},
		{"cuda/eager", device.CUDA, true, false, EmulatedBackend, "intra/eager"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rows := sweep(t, 2, func(o *collective.Options) {
				o.Backend, o.Eager, o.GPUScratch, o.Timeout = tc.backend, tc.eager, 64<<10, 30*time.Second
			}, func(c *collective.Communicator) Config {
				return Config{Sizes: []int64{1, 4097, 100_000}, Iters: 3, Warmup: 1,
					Symmetric: tc.symmetric, Backend: c.Backend().String(), Mode: "intra"}
			})
			if len(rows) != 6 {
				t.Fatalf("%d rows, want 6 (3 sizes, out of and in place)", len(rows))
			}
			for _, r := range rows {
				where := fmt.Sprintf("%d bytes in place %t", r.S, r.InPlace)
				if r.Wrong != 0 || r.Iters != 3 || r.Median <= 0 {
					t.Errorf("%s: %d wrong bytes, %d iterations, median %v", where, r.Wrong, r.Iters, r.Median)
				}
				if r.Backend != tc.wantBack || r.Mode != tc.wantMode {
					t.Errorf("%s: backend %q mode %q, want %q %q", where, r.Backend, r.Mode, tc.wantBack, tc.wantMode)
				}
			}
		})
	}
}

// TestGatherCopy: the all-gather's copy bound runs to its end for one,
// two and three threads, in and out of place, and times something.
func TestGatherCopy(t *testing.T) {
	for _, P := range []int{1, 2, 3} {
		for _, inPlace := range []bool{false, true} {
			done := make(chan float64, 1)
			go func() { us, _ := GatherCopy(64<<10, P, inPlace, time.Millisecond); done <- us }()
			select {
			case us := <-done:
				if us <= 0 && !(P == 1 && inPlace) {
					t.Errorf("P=%d in place %v: %v µs", P, inPlace, us)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("P=%d in place %v: still running after 30 s", P, inPlace)
			}
		}
	}
	if us, _ := GatherCopy(0, 2, false, time.Millisecond); us != 0 {
		t.Errorf("size 0: %v µs", us)
	}
}

// TestWarmupTime: with the warm-up's count left to the time rule, ranks
// agree on it (a rank that called once more would hang or mismatch the
// others) and every row is right.
func TestWarmupTime(t *testing.T) {
	rows := sweep(t, 3, func(o *collective.Options) { o.Timeout = 30 * time.Second }, func(*collective.Communicator) Config {
		return Config{Sizes: []int64{8, 4096}, Iters: 3, WarmupTime: 20 * time.Millisecond, Symmetric: true, Backend: "cpu", Mode: "intra"}
	})
	if len(rows) != 4 {
		t.Fatalf("%d rows, want 4", len(rows))
	}
	for _, r := range rows {
		if r.Wrong != 0 || r.Iters != 3 || r.Median <= 0 {
			t.Errorf("%d bytes in place %t: %d wrong bytes, %d iterations, median %v", r.S, r.InPlace, r.Wrong, r.Iters, r.Median)
		}
	}
}

// TestCeiling: with Config.Ceiling, each out-of-place row from
// CeilingMin is followed by its ceiling's row, timed as often, with the
// all-gather's P and S; the CSV holds both, and ByImpl splits them again
// as slimebench compare does. On a GPU's memory there is none.
func TestCeiling(t *testing.T) {
	rows := sweep(t, 2, func(o *collective.Options) { o.Timeout = 30 * time.Second }, func(*collective.Communicator) Config {
		return Config{Sizes: []int64{8, CeilingMin + 1}, Iters: 3, Warmup: 1, Ceiling: true, Symmetric: true, Backend: "cpu", Mode: "intra"}
	})
	want := []struct {
		impl    string
		S       int64
		inPlace bool
	}{{"slimego", 8, false}, {"slimego", 8, true},
		{"slimego", CeilingMin + 1, false}, {CeilingImpl, CeilingMin + 1, false}, {"slimego", CeilingMin + 1, true}}
	if len(rows) != len(want) {
		t.Fatalf("%d rows, want %d: %+v", len(rows), len(want), rows)
	}
	for i, w := range want {
		r := rows[i]
		if r.Impl != w.impl || r.S != w.S || r.InPlace != w.inPlace || r.P != 2 || r.Iters != 3 || r.Median <= 0 || r.Wrong != 0 {
			t.Errorf("row %d: %+v, want %s of %d bytes in place %t, P 2, 3 iterations, timed, nothing wrong", i, r, w.impl, w.S, w.inPlace)
		}
	}
	var csv bytes.Buffer
	if err := WriteCSV(&csv, rows); err != nil {
		t.Fatal(err)
	}
	back, err := ReadCSV(&csv)
	if err != nil {
		t.Fatal(err)
	}
	sets := ByImpl(back)
	if len(sets) != 2 || len(sets[0]) != 4 || sets[0][0].Impl != "slimego" || len(sets[1]) != 1 || sets[1][0].Impl != CeilingImpl {
		t.Errorf("ByImpl: %+v, want slimego's 4 rows then the ceiling's 1", sets)
	}
	// The ceiling's copy checks no byte: its wrong column is empty in
	// the CSV (read back as such), null in JSON and '-' in a table.
	for _, r := range back {
		if r.Unchecked != (r.Impl == CeilingImpl) {
			t.Errorf("read back %s row of %d bytes: unchecked %t", r.Impl, r.S, r.Unchecked)
		}
	}
	var js, tab bytes.Buffer
	if err := WriteJSON(&js, rows); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(js.String(), `"wrong": null`); n != 1 || strings.Count(js.String(), `"wrong": 0`) != 4 {
		t.Errorf("JSON: %d rows with wrong null, want the ceiling's alone:\n%s", n, js.String())
	}
	WriteTable(&tab, sets[1], "the ceiling")
	if !strings.Contains(tab.String(), "      -\n") {
		t.Errorf("the ceiling's table has no '-' for its wrong count:\n%s", tab.String())
	}

	// On a GPU's memory the ceiling adds no rows (make bench asks for it
	// on whatever backend the machine has).
	gpu := sweep(t, 2, func(o *collective.Options) {
		o.Backend, o.GPUScratch, o.Timeout = device.CUDA, 64<<10, 30*time.Second
	}, func(c *collective.Communicator) Config {
		return Config{Sizes: []int64{8}, Iters: 1, Warmup: 1, Ceiling: true, Backend: c.Backend().String(), Mode: "intra"}
	})
	if len(gpu) != 2 || gpu[0].Impl != "slimego" || gpu[1].Impl != "slimego" {
		t.Errorf("on the GPU: %+v, want slimego's two rows alone", gpu)
	}
}

// TestTimeRunsAlternates: with alt, each iteration times run and then alt
// apart, and each result gets its own median: an alt that takes 2 ms
// beside a run that takes nothing must say so, on every rank alike.
func TestTimeRunsAlternates(t *testing.T) {
	var mu sync.Mutex
	var got []Result
	testranks.Run(t, 1, 2, func(o *collective.Options) { o.Timeout = 30 * time.Second }, func(c *collective.Communicator) error {
		cfg := Config{Iters: 5, Warmup: 1}
		cfg.defaults()
		var res, alt Result
		res.P, alt.P, res.S, alt.S = 2, 2, 1000, 1000
		calls := 0
		err := timeRuns(context.Background(), c, cfg, &res, func() (int64, error) { return 0, nil }, func(context.Context) error { return nil },
			func(context.Context) error { calls++; time.Sleep(2 * time.Millisecond); return nil }, &alt)
		if calls != 5 {
			return fmt.Errorf("alt called %d times, want 5 (once per timed iteration)", calls)
		}
		mu.Lock()
		got = append(got, res, alt)
		mu.Unlock()
		return err
	})
	for i := 0; i+1 < len(got); i += 2 {
		res, alt := got[i], got[i+1]
		if alt.Median < 2000 || res.Median >= 1000 || alt.Iters != 5 || res.Iters != 5 || alt.AlgBW <= 0 {
			t.Errorf("run %.1f µs, alt %.1f µs (%d, %d iterations, alt algbw %v): want alt ≥ 2000 µs, run under 1000, 5 each",
				res.Median, alt.Median, res.Iters, alt.Iters, alt.AlgBW)
		}
	}
}

// TestMergeAlong: a further implementation's row comes from the run of
// its host's median row, not from its own median run; a row its host
// lacks is merged alone.
func TestMergeAlong(t *testing.T) {
	row := func(impl string, S int64, us float64) Result { return Result{Impl: impl, P: 2, S: S, Median: us} }
	host := [][]Result{{row("slimego", 8, 3)}, {row("slimego", 8, 1)}, {row("slimego", 8, 2)}}
	other := [][]Result{
		{row("ceiling", 8, 5), row("ceiling", 64, 50)},
		{row("ceiling", 8, 7), row("ceiling", 64, 90)},
		{row("ceiling", 8, 9), row("ceiling", 64, 70)},
	}
	got := MergeAlong(host, other)
	if len(got) != 2 || got[0].Median != 9 || got[1].Median != 70 {
		t.Errorf("MergeAlong: %+v, want 9 µs at 8 B (the run of the host's median, 2 µs) and 70 at 64 B (the median alone)", got)
	}
	if m := Merge(other...); m[0].Median != 7 {
		t.Errorf("Merge: %+v, want 7 µs at 8 B", m)
	}
}

// sweep runs AllGather on P in-process ranks, each with the Config cfg
// makes for it, and returns rank 0's rows.
func sweep(t *testing.T, P int, opts func(*collective.Options), cfg func(*collective.Communicator) Config) []Result {
	t.Helper()
	var mu sync.Mutex
	var rows []Result
	testranks.Run(t, 1, P, opts, func(c *collective.Communicator) error {
		rs, err := AllGather(context.Background(), c, cfg(c))
		if err == nil && c.Rank() == 0 {
			mu.Lock()
			rows = rs
			mu.Unlock()
		}
		return err
	})
	return rows
}

// TestTimeRule: without fixed counts the timed iterations last MinTime at
// least (BENCHMARKS.md: at least 5 and 0.2 s per size), also where the calls
// turn out faster than the warm-up's (here 2 ms warm, 20 µs timed), on
// every rank alike.
func TestTimeRule(t *testing.T) {
	const minTime = 100 * time.Millisecond
	var mu sync.Mutex
	var got []Result
	testranks.Run(t, 1, 2, func(o *collective.Options) { o.Timeout = 30 * time.Second }, func(c *collective.Communicator) error {
		cfg := Config{Warmup: 5, MinTime: minTime}
		cfg.defaults()
		var res Result
		res.P, res.S = 2, 1000
		calls := 0
		err := timeRuns(context.Background(), c, cfg, &res, func() (int64, error) { return 0, nil }, func(context.Context) error {
			if calls++; calls <= 5 {
				time.Sleep(2 * time.Millisecond)
			} else {
				time.Sleep(20 * time.Microsecond)
			}
			return nil
		}, nil, nil)
		mu.Lock()
		got = append(got, res)
		mu.Unlock()
		return err
	})
	for _, r := range got {
		if r.Timed < minTime || r.Iters < 5 || r.Iters != got[0].Iters {
			t.Errorf("timed %v in %d iterations (rank 0: %d), want at least %v and 5, the same on every rank", r.Timed, r.Iters, got[0].Iters, minTime)
		}
	}
}

// TestSizes: the sweep goes from min to max by factor, each size larger
// than the one before (a factor near 1 advances by a byte at least rather
// than stopping at min), and refuses a sweep of more than MaxSizes sizes
// (a factor near 1 over a wide range) before building it.
func TestSizes(t *testing.T) {
	for _, tc := range []struct {
		min, max int64
		f        float64
		want     string // the sizes, or the error's text
	}{
		{8, 64 << 20, 8, "[8 64 512 4096 32768 262144 2097152 16777216]"},
		{8, 12, 1.05, "[8 9 10 11 12]"},
		{0, 8, 2, "[0 1 2 4 8]"},
		{5, 5, 1, "[5]"},
		{8, 4, 2, "bad sweep"},
		{8, 16, 1, "bad sweep"},
		{1000000, 1 << 62, 1.000001, fmt.Sprintf("more than %d sizes", MaxSizes)},
	} {
		s, err := Sizes(tc.min, tc.max, tc.f)
		got := fmt.Sprint(s)
		if err != nil {
			got = err.Error()
		}
		if !strings.Contains(got, tc.want) {
			t.Errorf("Sizes(%d, %d, %g) = %s, want %s", tc.min, tc.max, tc.f, got, tc.want)
		}
	}
}

// TestOverlapTableNoisy: a shape whose shorter part (t_comm or t_gemm) is
// a small share of t_seq has its efficiency marked as noise, with the
// mark explained; the others are not marked.
func TestOverlapTableNoisy(t *testing.T) {
	var b strings.Builder
	WriteOverlapTable(&b, []OverlapResult{
		{M: 64, N: 256, K: 256, Dtype: "float32", Pieces: 4, Comm: 200, GEMM: 9216, Seq: 9110, Overlap: 9400, Efficiency: -1.45},
		{M: 256, N: 256, K: 256, Dtype: "float32", Pieces: 4, Comm: 3000, GEMM: 9000, Seq: 12000, Overlap: 10000, Efficiency: 0.667},
	}, "test")
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if !strings.Contains(b.String(), "# *: min(t_comm, t_gemm) is under 10% of t_seq") ||
		!strings.HasSuffix(lines[len(lines)-2], " *") || strings.HasSuffix(lines[len(lines)-1], "*") {
		t.Errorf("want the first shape marked noisy, the second not:\n%s", b.String())
	}
	// The CSV's reader learns it from NoisyRows (slimebench prints them
	// on stderr): the first shape, and only it.
	noisy := NoisyRows([]OverlapResult{
		{M: 64, N: 256, K: 256, Dtype: "float32", Comm: 200, GEMM: 9216, Seq: 9110, Overlap: 9400, Efficiency: -1.45},
		{M: 256, N: 256, K: 256, Dtype: "float32", Comm: 3000, GEMM: 9000, Seq: 12000, Overlap: 10000, Efficiency: 0.667},
	})
	if len(noisy) != 1 || !strings.Contains(noisy[0], "m=64 n=256 k=256 float32: efficiency -1.450") {
		t.Errorf("NoisyRows: %q, want the first shape alone", noisy)
	}
}

// TestLaterCallsChecked: an all-gather that gathers its first call right
// and then does nothing (a broken plan, a graph replayed wrong) reports
// wrong bytes: after the timed calls, another round's data is gathered
// once more and checked. The first call alone was checked before, and
// round 1's bytes stayed right.
func TestLaterCallsChecked(t *testing.T) {
	testHookRun = func(run func(context.Context) error) func(context.Context) error {
		calls := 0
		return func(ctx context.Context) error {
			calls++
			if calls == 1 {
				return run(ctx)
			}
			return nil // every rank alike: no peer waits
		}
	}
	defer func() { testHookRun = nil }()
	rows := sweep(t, 2, nil, func(c *collective.Communicator) Config {
		return Config{Sizes: []int64{4096}, Iters: 3, Warmup: 1, Backend: c.Backend().String(), Mode: "intra"}
	})
	for _, r := range rows {
		if r.Wrong == 0 {
			t.Errorf("%d bytes in place %t: 0 wrong bytes from a gather that did nothing after its first call", r.S, r.InPlace)
		}
	}
}

// TestWrongCountsEachByteOnce: the wrong column is the number of wrong
// bytes in the ranks' destinations (P·P·S out of place; in place each
// rank's own block is its source, so P·(P-1)·S could be wrong), however
// many times they are checked: a gather that moves nothing is wrong in
// nearly every one of those bytes (a byte of the stale fill may match by
// chance), and in no more.
func TestWrongCountsEachByteOnce(t *testing.T) {
	const P, S = 2, 4096
	nothing := func(context.Context) error { return nil } // every rank alike: no peer waits
	cases := []struct {
		name string
		hook func(run func(context.Context) error) func(context.Context) error
	}{
		{"no call moves anything", func(func(context.Context) error) func(context.Context) error { return nothing }},
		{"the first call alone moves", func(run func(context.Context) error) func(context.Context) error {
			calls := 0
			return func(ctx context.Context) error {
				if calls++; calls == 1 {
					return run(ctx)
				}
				return nil
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			testHookRun = tc.hook
			defer func() { testHookRun = nil }()
			rows := sweep(t, P, nil, func(c *collective.Communicator) Config {
				return Config{Sizes: []int64{S}, Iters: 3, Warmup: 1, Backend: c.Backend().String(), Mode: "intra"}
			})
			for _, r := range rows {
				most := int64(P * P * S)
				if r.InPlace {
					most = int64(P * (P - 1) * S)
				}
				if r.Wrong > most || r.Wrong < most*9/10 {
					t.Errorf("in place %t: wrong = %d, want at most the %d bytes that could be wrong, and nearly all", r.InPlace, r.Wrong, most)
				}
			}
		})
	}
}

// TestProgressRow: the progress line after each size carries the row
// BENCHMARKS.md leads with, out of place (the table's first columns, the one
// "Avg bus bandwidth" averages), not the in-place row that happens to
// finish the size.
func TestProgressRow(t *testing.T) {
	var mu sync.Mutex
	var got []Result
	sweep(t, 2, nil, func(c *collective.Communicator) Config {
		return Config{Sizes: []int64{8, 4096}, Iters: 3, Warmup: 1, Backend: "cpu", Mode: "intra",
			Progress: func(done, total int, r Result) {
				mu.Lock()
				got = append(got, r)
				mu.Unlock()
			}}
	})
	if len(got) != 2 {
		t.Fatalf("%d progress calls, want 2", len(got))
	}
	for _, r := range got {
		if r.InPlace || r.Impl != "slimego" {
			t.Errorf("progress of %d bytes: %s in place %t, want slimego's out-of-place row", r.S, r.Impl, r.InPlace)
		}
	}
}

// TestGatherCopyChecked: slimebench memcpy --gather prints its rows in
// the all-gather's table, whose #wrong column and "Out of bounds values"
// line say the destinations were checked: GatherCopy compares every block
// of every thread's destination with its source, and a byte that a copy
// got wrong is counted (here one flipped after the timed rounds), not
// printed as 0 and OK.
func TestGatherCopyChecked(t *testing.T) {
	const s, P = 4096, 3
	for _, inPlace := range []bool{false, true} {
		if _, wrong := GatherCopy(s, P, inPlace, time.Millisecond); wrong != 0 {
			t.Errorf("in place %v: %d wrong bytes from plain copies", inPlace, wrong)
		}
		testHookGatherCopied = func(dsts [][]byte) { dsts[1][2*s+17] ^= 0xff }
		us, wrong := GatherCopy(s, P, inPlace, time.Millisecond)
		testHookGatherCopied = nil
		if wrong != 1 {
			t.Errorf("in place %v: a byte of thread 1's block 2 flipped: %d wrong bytes, want 1", inPlace, wrong)
		}
		r := Result{Impl: "memcpy-gather", Backend: "cpu", Mode: "intra", P: P, Nodes: 1, S: s, InPlace: inPlace, Median: us, Wrong: wrong}
		r.Bandwidths()
		var tbl strings.Builder
		WriteTable(&tbl, []Result{r}, "TestGatherCopyChecked")
		if !strings.Contains(tbl.String(), "Out of bounds values : 1 FAILED") {
			t.Errorf("in place %v: the table does not say the wrong byte:\n%s", inPlace, tbl.String())
		}
	}
}

// TestJSONKeysInCSVOrder: every JSON row has the CSV's columns as keys, in
// the CSV's order (the impl key came after the others, the order of the
// struct's embedding), and the in-place suffix as the CSV has it.
func TestJSONKeysInCSVOrder(t *testing.T) {
	rows := []Result{
		{Impl: "slimego", Backend: "cpu", Mode: "intra", P: 2, Nodes: 1, S: 8, Median: 1.5, AlgBW: 0.01, BusBW: 0.005},
		{Impl: "slimego", Backend: "cpu", Mode: "intra", P: 2, Nodes: 1, S: 8, Median: 1.25, InPlace: true, Wrong: 3},
		{Impl: CeilingImpl, Backend: "cpu", Mode: "intra", P: 2, Nodes: 1, S: 8, Unchecked: true},
		// A time too short to divide by: no number JSON can write.
		{Impl: "slimego", Backend: "cpu", Mode: "intra", P: 2, Nodes: 1, S: 8, AlgBW: math.Inf(1), BusBW: math.NaN()},
	}
	var js bytes.Buffer
	if err := WriteJSON(&js, rows); err != nil {
		t.Fatal(err)
	}
	if !json.Valid(js.Bytes()) {
		t.Fatalf("not JSON:\n%s", js.String())
	}
	var none bytes.Buffer
	if err := WriteJSON(&none, nil); err != nil || strings.TrimSpace(none.String()) != "[]" {
		t.Fatalf("no rows: %q, %v; want []", none.String(), err)
	}
	dec := json.NewDecoder(&js)
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
		t.Fatalf("want an array, got %v %v", tok, err)
	}
	var csv bytes.Buffer
	if err := WriteCSV(&csv, rows); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(csv.String()), "\n")
	for i := 0; dec.More(); i++ {
		if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
			t.Fatalf("row %d: want an object, got %v %v", i, tok, err)
		}
		var keys, vals []string
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				t.Fatal(err)
			}
			v, err := dec.Token()
			if err != nil {
				t.Fatal(err)
			}
			keys = append(keys, k.(string))
			switch v := v.(type) {
			case nil:
				vals = append(vals, "")
			case json.Number:
				vals = append(vals, v.String())
			default:
				vals = append(vals, fmt.Sprint(v))
			}
		}
		dec.Token() // '}'
		if got, want := strings.Join(keys, ","), strings.Join(CSVHeader, ","); got != want {
			t.Errorf("row %d's keys: %s\nwant the CSV's: %s", i, got, want)
		}
		// The same values as the CSV's line (numbers as JSON writes them).
		want := strings.Split(lines[i+1], ",")
		for j := range want {
			if x, err := strconv.ParseFloat(want[j], 64); err == nil && (math.IsInf(x, 0) || math.IsNaN(x)) {
				want[j] = "" // null
			}
			if j < len(vals) && vals[j] != want[j] {
				if a, errA := strconv.ParseFloat(vals[j], 64); errA == nil {
					if b, errB := strconv.ParseFloat(want[j], 64); errB == nil && a == b {
						continue
					}
				}
				t.Errorf("row %d, %s: JSON %q, CSV %q", i, CSVHeader[j], vals[j], want[j])
			}
		}
	}
}
