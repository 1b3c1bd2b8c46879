// Package bench measures AllGather the way docs/BENCHMARKS.md prescribes,
// so that slimego's figures stand beside nccl-tests, OpenMPI and Gloo: a
// sweep of per-rank sizes, warm-up, then timed iterations (at least 5 and
// at least 0.2 s), the median over iterations of the slowest rank's time,
// algbw and busbw, and a byte-for-byte check of every size.
package bench

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/interleave"
	"github.com/slimego/slimego/internal/pattern"
)

// Result is one row: one implementation at one per-rank size.
type Result struct {
	Impl    string  `json:"impl"`
	Backend string  `json:"backend"`
	Mode    string  `json:"mode"`
	P       int     `json:"P"`
	Nodes   int     `json:"nodes"`
	S       int64   `json:"S"`
	Median  float64 `json:"median_us"`
	AlgBW   float64 `json:"algbw_GBps"`
	BusBW   float64 `json:"busbw_GBps"`
	// Wrong is the number of wrong bytes in the ranks' destinations, each
	// counted once (as the OpenMPI program counts them).
	Wrong int64 `json:"wrong"`
	// Unchecked: the row compares no byte (a memcpy, a raw TCP transfer,
	// the ceiling's copy): its wrong column is empty in CSV, null in
	// JSON and '-' in the table, where 0 would read as checked.
	Unchecked bool `json:"-"`
	InPlace   bool `json:"-"`
	Iters     int  `json:"-"`
	// Timed is how long the timed iterations took, barriers included
	// (the slowest rank's).
	Timed time.Duration `json:"-"`
}

// Bandwidths fills AlgBW and BusBW from P, S and Median, as nccl-tests
// defines them for all-gather: algbw = P·S/t, busbw = algbw·(P−1)/P.
func (r *Result) Bandwidths() {
	if r.Median <= 0 {
		return
	}
	r.AlgBW = float64(r.P) * float64(r.S) / (r.Median * 1e-6) / 1e9
	r.BusBW = r.AlgBW * float64(r.P-1) / float64(r.P)
}

// MaxSizes bounds the sizes of one sweep.
const MaxSizes = 1000

// Sizes is the sweep min, min·factor, … up to max (inclusive), each size
// at least a byte larger than the one before (a factor near 1 would
// otherwise round back to the same size), at most MaxSizes of them.
func Sizes(min, max int64, factor float64) ([]int64, error) {
	if min < 0 || max < min || factor <= 1 && min != max || math.IsNaN(factor) || math.IsInf(factor, 0) {
		return nil, fmt.Errorf("bench: bad sweep %d..%d by ×%g", min, max, factor)
	}
	var s []int64
	for n := min; n <= max; {
		if len(s) == MaxSizes {
			return nil, fmt.Errorf("bench: the sweep %d..%d by ×%g has more than %d sizes", min, max, factor, MaxSizes)
		}
		s = append(s, n)
		f := float64(n) * factor
		if f >= math.MaxInt64 {
			break
		}
		next := int64(math.Round(f))
		if next <= n {
			next = n + 1
		}
		if next <= n { // n+1 overflowed
			break
		}
		n = next
	}
	return s, nil
}

// DefaultWarmupTime is how long each size's warm-up calls take at least
// (in up to five rounds; a warm-up whose calls keep slowing down may end
// short of it). A TCP connection adapts its congestion and receive
// windows to a larger message over many calls, which a warm-up of five
// calls left in the timed ones (docs/PERFORMANCE.md). The OpenMPI program
// of bench/mpi warms up alike.
const DefaultWarmupTime = 100 * time.Millisecond

// MaxIters is the time rule's cap on a size's timed iterations (the
// OpenMPI program of bench/mpi caps its count alike), and the most that
// Config.Iters and Config.Warmup may fix.
const MaxIters = interleave.MaxIters

// Config drives an AllGather sweep.
type Config struct {
	Sizes []int64
	// Iters and Warmup fix the counts, at most MaxIters; zero applies the
	// time rule (a warm-up of at least 5 calls and WarmupTime, then at
	// least MinIters calls and MinTime).
	Iters, Warmup int
	MinIters      int
	MinTime       time.Duration
	// WarmupTime is how long a size's warm-up calls take at least (default
	// DefaultWarmupTime; see there) unless Warmup fixes their count.
	WarmupTime time.Duration
	// Symmetric puts the buffers in symmetric memory (Communicator.Alloc).
	Symmetric bool
	// Ceiling times beside each out-of-place size from CeilingMin the
	// copies the all-gather makes, alone: after every timed call, between barriers,
	// each rank copies its source into each of the P blocks of its
	// destination (the same buffers, pages and bytes as the all-gather's:
	// P·S written, S read per rank). The row, named CeilingImpl, follows
	// the size's out-of-place row. With a rank per core it is the
	// P-thread copy that bounds the all-gather, taken in the same moments
	// as the all-gather: on a shared machine the memory's speed moves
	// while runs go on (docs/PERFORMANCE.md), so a bound taken apart from
	// the runs says little about any one of them. Only host memory on one
	// node has it (see CeilingApplies); elsewhere Ceiling adds no rows.
	Ceiling bool
	Backend string
	Mode    string
	// Progress is called on rank 0 after each size with its out-of-place
	// row (the table's first columns).
	Progress func(done, total int, r Result)
}

func (c *Config) defaults() {
	if c.MinIters <= 0 {
		c.MinIters = 5
	}
	if c.MinTime <= 0 {
		c.MinTime = 200 * time.Millisecond
	}
	if c.WarmupTime <= 0 {
		c.WarmupTime = DefaultWarmupTime
	}
	if c.Backend == "" {
		c.Backend = "cpu"
	}
	if c.Mode == "" {
		c.Mode = "intra"
	}
}

// CeilingImpl names the rows of Config.Ceiling.
const CeilingImpl = "ceiling"

// CeilingMin is the least size that Config.Ceiling measures: the sizes
// of the copy bound's target, whose buffers outgrow the caches. Below,
// the copy between the calls changes what the calls find in the caches
// (whose lines a peer's copy has just read), and so the all-gather's own
// row (docs/PERFORMANCE.md).
const CeilingMin = 16 << 20

// CeilingApplies says whether Config.Ceiling measures anything on c: its
// buffers are host memory and its ranks on one node (across nodes the
// link bounds the all-gather, not the copies; a GPU's copies are its own).
func CeilingApplies(c *collective.Communicator) bool {
	return c.Device().Kind() == device.CPU && c.Nodes() == 1
}

// AllGather runs the sweep on every rank of c and returns, on every rank,
// an out-of-place and an in-place row per size (and with Config.Ceiling,
// the ceiling's row after the out-of-place one).
func AllGather(ctx context.Context, c *collective.Communicator, cfg Config) ([]Result, error) {
	if cfg.Iters < 0 || cfg.Iters > MaxIters || cfg.Warmup < 0 || cfg.Warmup > MaxIters {
		return nil, fmt.Errorf("bench: rank %d: %d timed and %d warm-up iterations: want 0 (the time rule) to %d each", c.Rank(), cfg.Iters, cfg.Warmup, MaxIters)
	}
	cfg.defaults()
	cfg.Ceiling = cfg.Ceiling && CeilingApplies(c)
	var out []Result
	for i, s := range cfg.Sizes {
		var outOfPlace Result
		for _, inPlace := range []bool{false, true} {
			r, ceil, err := oneSize(ctx, c, cfg, int(s), inPlace)
			if err != nil {
				return out, fmt.Errorf("bench: %d bytes per rank: %w", s, err)
			}
			out = append(out, r)
			if ceil != nil {
				out = append(out, *ceil)
			}
			if !inPlace {
				outOfPlace = r
			}
		}
		if c.Rank() == 0 && cfg.Progress != nil {
			cfg.Progress(i+1, len(cfg.Sizes), outOfPlace)
		}
	}
	return out, nil
}

// oneSize measures one size on the communicator's backend: the buffers
// live where it keeps memory (host memory, or its GPU's), get fresh data,
// are gathered once by a planned all-gather and checked byte for byte, then
// the same plan is timed, with Config.Ceiling's copy between its calls
// where it applies.
func oneSize(ctx context.Context, c *collective.Communicator, cfg Config, n int, inPlace bool) (Result, *Result, error) {
	P, me := c.Size(), c.Rank()
	res := Result{Impl: "slimego", Backend: cfg.Backend, Mode: cfg.Mode, P: P, Nodes: c.Nodes(), S: int64(n), InPlace: inPlace}
	if BackendName(c) == EmulatedBackend {
		res.Backend = EmulatedBackend
	}
	b, err := planBuffers(ctx, c, n, inPlace, cfg.Symmetric)
	defer b.free()
	if err != nil {
		return res, nil, err
	}
	run := b.plan.Run
	if testHookRun != nil {
		run = testHookRun(run)
	}
	// Correctness first: fresh data in, every byte checked.
	pattern.Fill(b.dst, 0xdead)
	pattern.Fill(b.src, pattern.Seed(me, 1, uint64(n)))
	if err := b.load(); err != nil {
		return res, nil, err
	}
	if err := run(ctx); err != nil {
		return res, nil, err
	}
	if err := b.unload(); err != nil {
		return res, nil, err
	}
	if m := b.plan.Mode(); m != "host" {
		res.Mode = cfg.Mode + "/" + m
	}
	first := countWrong(b.dst, P, n, 1)
	// After the timed calls, another round's data gathered once more and
	// checked: a gather that made its first call right and its later ones
	// not (did nothing, replayed a graph wrong) leaves round 1's bytes.
	// The rank's count is the larger of the two checks', so that a byte of
	// the destination is counted once however often it was wrong: the
	// column never exceeds the bytes the destinations hold.
	check := func() (int64, error) {
		pattern.Fill(b.dst, 0xdead)
		pattern.Fill(b.src, pattern.Seed(me, 2, uint64(n)))
		if err := b.load(); err != nil {
			return 0, err
		}
		if err := run(ctx); err != nil {
			return 0, err
		}
		if err := b.unload(); err != nil {
			return 0, err
		}
		return max(first, countWrong(b.dst, P, n, 2)), nil
	}
	if !cfg.Ceiling || inPlace || n < CeilingMin {
		return res, nil, timeRuns(ctx, c, cfg, &res, check, run, nil, nil)
	}
	// The copy writes the destination the gather has filled: its bytes
	// were checked already (countWrong, before the timed calls, which
	// fill it alike), and barriers keep the copy apart from every call.
	ceil := Result{Impl: CeilingImpl, Backend: res.Backend, Mode: "memcpy", P: P, Nodes: res.Nodes, S: int64(n), Unchecked: true}
	to, ok1 := b.dstBuf.(*device.HostBuffer)
	from, ok2 := b.srcBuf.(*device.HostBuffer)
	if !ok1 || !ok2 {
		return res, nil, fmt.Errorf("bench: rank %d: the ceiling copies host memory; the buffers are %T and %T", me, b.dstBuf, b.srcBuf)
	}
	dst, src := to.Bytes(), from.Bytes()
	cp := func(context.Context) error {
		for r := range P {
			copy(dst[r*n:r*n+n], src)
		}
		return nil
	}
	err = timeRuns(ctx, c, cfg, &res, check, run, cp, &ceil)
	return res, &ceil, err
}

// testHookRun, set by tests, wraps the planned all-gather oneSize runs
// (to make it fail as a broken one would).
var testHookRun func(run func(context.Context) error) func(context.Context) error

// gatherBuffers are one size's buffers of the communicator's device, and
// the plan that gathers into them. dst and src are host memory to fill and
// check: load copies them into the device's buffers (dst first, then src,
// which may lie inside it) and unload copies the gathered dst back. free
// releases everything, also after a partial setup.
type gatherBuffers struct {
	plan           *collective.Plan
	dstBuf, srcBuf device.Buffer // the device's buffers that plan gathers
	dst, src       []byte
	load, unload   func() error
	frees          []func() error
}

func (b *gatherBuffers) free() {
	for i := len(b.frees) - 1; i >= 0; i-- {
		b.frees[i]()
	}
}

// planBuffers allocates an all-gather's destination (P·n bytes) and
// source (n bytes, or with inPlace a view of the rank's own block of the
// destination) on the communicator's device, and plans the gather
// (Communicator.PlanBuffers): host memory on the CPU, the GPU's on CUDA;
// the plan runs as the communicator says (host, graph or eager).
func planBuffers(ctx context.Context, c *collective.Communicator, n int, inPlace, symmetric bool) (gatherBuffers, error) {
	var b gatherBuffers
	P, me := c.Size(), c.Rank()
	dst, err := allocBuffer(ctx, c, P*n, symmetric, &b.frees)
	if err != nil {
		return b, err
	}
	var src device.Buffer
	if inPlace {
		src, err = dst.View(me*n, n)
	} else {
		src, err = allocBuffer(ctx, c, n, symmetric, &b.frees)
	}
	if err != nil {
		return b, err
	}
	b.dstBuf, b.srcBuf = dst, src
	if b.plan, err = c.PlanBuffers(ctx, dst, src); err != nil {
		return b, err
	}
	b.frees = append(b.frees, b.plan.Close) // before the buffers it gathers into
	b.dst, b.src = make([]byte, P*n), make([]byte, n)
	b.load = func() error {
		if err := dst.CopyIn(b.dst); err != nil {
			return err
		}
		return src.CopyIn(b.src)
	}
	b.unload = func() error { return dst.CopyOut(b.dst) }
	return b, nil
}

// allocBuffer allocates n bytes of the communicator's device and adds its
// release to frees. With symmetric, on the CPU backend, they are the
// node's symmetric memory (Communicator.Alloc, which peers read in
// place); the symmetric memory Alloc makes is host memory, so on CUDA the
// buffer is the device's own either way.
func allocBuffer(ctx context.Context, c *collective.Communicator, n int, symmetric bool, frees *[]func() error) (device.Buffer, error) {
	d := c.Device()
	if symmetric && d.Kind() == device.CPU {
		s, err := c.Alloc(ctx, n)
		if err != nil {
			return nil, err
		}
		*frees = append(*frees, s.Free)
		return device.NewHostBuffer(s.Bytes(), true), nil
	}
	buf, err := d.NewBuffer(n)
	if err != nil {
		return nil, err
	}
	*frees = append(*frees, buf.Free)
	return buf, nil
}

// buffers allocates an all-gather's destination (P·n bytes) and source
// (n bytes, or with inPlace the rank's own block of the destination), in
// symmetric memory or on the Go heap; free releases them.
func buffers(ctx context.Context, c *collective.Communicator, n int, inPlace, symmetric bool) (dst, src []byte, free func(), err error) {
	P, me := c.Size(), c.Rank()
	var frees []func() error
	free = func() {
		for _, f := range frees {
			f()
		}
	}
	if symmetric {
		d, err := c.Alloc(ctx, P*n)
		if err != nil {
			return nil, nil, free, err
		}
		frees = append(frees, d.Free)
		dst = d.Bytes()
		if !inPlace {
			s, err := c.Alloc(ctx, n)
			if err != nil {
				return nil, nil, free, err
			}
			frees = append(frees, s.Free)
			src = s.Bytes()
		}
	} else {
		dst = make([]byte, P*n)
		if !inPlace {
			src = make([]byte, n)
		}
	}
	if inPlace {
		src = dst[me*n : me*n+n]
	}
	return dst, src, free, nil
}

// timeRuns applies BENCHMARKS.md's timing to run on every rank: warm-up, an
// iteration count every rank agrees on, each iteration between barriers,
// the slowest rank's time of each, then the median; it fills res.
//
// With alt, each timed call of run is followed, between barriers, by a
// timed call of alt, whose times fill altRes alike (Wrong aside). check,
// called on every rank after the timed calls, counts this rank's wrong
// bytes; res.Wrong is every rank's.
func timeRuns(ctx context.Context, c *collective.Communicator, cfg Config, res *Result, check func() (int64, error), run, alt func(context.Context) error, altRes *Result) error {
	P := c.Size()
	warm := cfg.Warmup
	if warm <= 0 {
		warm = 5
	}
	// The iteration count comes from the warm-up's median, not its
	// longest run: across nodes a TCP retransmission timeout now and then
	// stretches one run by 200 ms or more, and counting from it would leave
	// the size a handful of iterations.
	var t0 time.Time
	warmup := func(n int) ([]float64, error) {
		ts := make([]float64, n)
		for i := range ts {
			if err := c.Barrier(ctx); err != nil {
				return nil, err
			}
			t0 = time.Now()
			if err := run(ctx); err != nil {
				return nil, err
			}
			ts[i] = time.Since(t0).Seconds()
		}
		return ts, nil
	}
	// pace agrees on how a round of calls went: every rank's median call
	// and time spent, the largest of each.
	pace := make([]float64, 2*P)
	agree := func(ts []float64) (per, spent float64, err error) {
		sum := 0.0
		for _, t := range ts {
			sum += t
		}
		if err := collective.AllGatherOf(ctx, c, pace, []float64{interleave.Median(ts), sum}); err != nil {
			return 0, 0, err
		}
		for r := range P {
			per, spent = max(per, pace[2*r]), max(spent, pace[2*r+1])
		}
		return per, spent, nil
	}
	warmTimes, err := warmup(warm)
	if err != nil {
		return err
	}
	per, spent, err := agree(warmTimes)
	if err != nil {
		return err
	}
	// The rest of the warm-up, until its calls have taken WarmupTime: in
	// rounds whose counts every rank agrees on, each from the pace of the
	// round before (early calls may be the slow ones); the iteration count
	// then comes from the last round's pace.
	for round := 0; cfg.Warmup <= 0 && round < 4 && spent < cfg.WarmupTime.Seconds(); round++ {
		more := min(int(math.Ceil((cfg.WarmupTime.Seconds()-spent)/(per+2e-6))), 100_000)
		if warmTimes, err = warmup(more); err != nil {
			return err
		}
		var took float64
		if per, took, err = agree(warmTimes); err != nil {
			return err
		}
		spent += took
	}
	// The timed iterations: a first batch counted from the warm-up's pace,
	// then, under the time rule, more batches until they have taken
	// MinTime (the calls may run faster than the warm-up's, and the
	// barrier's cost is not known beforehand). After each batch the ranks
	// agree on the time it took (the slowest rank's), so that every rank
	// runs as many iterations.
	const maxIters = MaxIters
	n := cfg.Iters
	if n <= 0 {
		per += 2e-6 // the barrier is not free
		n = min(max(cfg.MinIters, int(math.Ceil(cfg.MinTime.Seconds()/per))), maxIters)
	}
	var times, altTimes []float64
	timed := func(f func(context.Context) error) (float64, error) {
		if err := c.Barrier(ctx); err != nil {
			return 0, err
		}
		t0 = time.Now()
		if err := f(ctx); err != nil {
			return 0, err
		}
		return float64(time.Since(t0).Nanoseconds()) / 1e3, nil
	}
	var took float64 // seconds, the slowest rank's
	for n > 0 {
		times = slices.Grow(times, n) // no allocation between the timed calls
		if alt != nil {
			altTimes = slices.Grow(altTimes, n)
		}
		start := time.Now()
		for range n {
			d, err := timed(run)
			if err != nil {
				return err
			}
			times = append(times, d)
			if alt == nil {
				continue
			}
			if d, err = timed(alt); err != nil {
				return err
			}
			altTimes = append(altTimes, d)
		}
		if err := collective.AllGatherOf(ctx, c, pace[:P], []float64{time.Since(start).Seconds()}); err != nil {
			return err
		}
		took += slices.Max(pace[:P])
		n = 0
		if cfg.Iters <= 0 && took < cfg.MinTime.Seconds() && len(times) < maxIters {
			pace := took / float64(len(times)) // per iteration, barriers included
			n = min(int(math.Ceil((cfg.MinTime.Seconds()-took)/pace)), maxIters-len(times))
		}
	}
	iters := len(times)
	// The slowest rank's time of each iteration, then the median.
	everyone := make([]float64, P*iters)
	if alt != nil {
		if err := collective.AllGatherOf(ctx, c, everyone, altTimes); err != nil {
			return err
		}
		altRes.Median, altRes.Iters, altRes.Timed = slowestMedian(everyone, altTimes, P), iters, time.Duration(took*1e9)
		altRes.Bandwidths()
	}
	if err := collective.AllGatherOf(ctx, c, everyone, times); err != nil {
		return err
	}
	wrong, err := check()
	if err != nil {
		return err
	}
	wrongs := make([]int64, P)
	if err := collective.AllGatherOf(ctx, c, wrongs, []int64{wrong}); err != nil {
		return err
	}
	res.Median = slowestMedian(everyone, times, P)
	for _, w := range wrongs {
		res.Wrong += w
	}
	res.Iters, res.Timed = iters, time.Duration(took*1e9)
	res.Bandwidths()
	return nil
}

// slowestMedian is the median over iterations of the slowest rank's time:
// everyone holds P ranks' times of len(times) iterations each, rank by
// rank; times is overwritten.
func slowestMedian(everyone, times []float64, P int) float64 {
	iters := len(times)
	for i := range times {
		m := 0.0
		for r := range P {
			m = max(m, everyone[r*iters+i])
		}
		times[i] = m
	}
	return interleave.Median(times)
}

// countWrong counts the bytes of dst (P blocks of n) that differ from
// what the ranks' patterns of round say.
func countWrong(dst []byte, P, n, round int) int64 {
	var wrong int64
	for r := range P {
		blk := dst[r*n : r*n+n]
		if i := pattern.Check(blk, pattern.Seed(r, round, uint64(n))); i >= 0 {
			want := make([]byte, n)
			pattern.Fill(want, pattern.Seed(r, round, uint64(n)))
			for j := i; j < n; j++ {
				if blk[j] != want[j] {
					wrong++
				}
			}
		}
	}
	return wrong
}
