// Command slimebench measures slimego as docs/BENCHMARKS.md prescribes.
//
//	slimerun --standalone --nproc-per-node 2 slimebench allgather -b 8 -e 64M -f 8
//	slimebench memcpy -b 8 -e 64M [--threads 2] [--gather]
//	slimebench compare slimego.csv openmpi.csv
//
// allgather runs under a launcher (slimerun, torchrun, mpirun); rank 0
// prints an nccl-tests-style table, or CSV or JSON with --csv/--json, and a
// progress line on stderr after each size.
package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/slimego/slimego/bench"
	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/inter"
	"github.com/slimego/slimego/internal/bytesize"
	"github.com/slimego/slimego/internal/machine"
	"github.com/slimego/slimego/overlap"
	"github.com/slimego/slimego/p2p"
)

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "allgather":
		err = allgather(os.Args[2:])
	case "memcpy":
		err = memcpy(os.Args[2:])
	case "tcp":
		err = tcp(os.Args[2:])
	case "link":
		err = linkCmd(os.Args[2:])
	case "p2p":
		err = p2pCmd(os.Args[2:])
	case "d2d":
		err = d2d(os.Args[2:])
	case "overlap":
		err = overlapCmd(os.Args[2:])
	case "gemm":
		err = gemmCmd(os.Args[2:])
	case "compare":
		err = compare(os.Args[2:])
	case "-h", "--help", "help":
		usage()
		return
	default:
		fmt.Fprintf(os.Stderr, "slimebench: unknown command %q\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	if errors.Is(err, pflag.ErrHelp) { // the flags' usage is printed
		return
	}
	if err != nil {
		if _, ok := errors.AsType[reportedError](err); !ok {
			fmt.Fprintln(os.Stderr, "slimebench:", err)
		}
		var ue usageError
		if errors.As(err, &ue) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// reportedError is an error that was printed already, as main prints
// one, before what came after it (an endpoint's Close) could delay it.
type reportedError struct{ error }

func (e reportedError) Unwrap() error { return e.error }

// usageError is a mistake in the command line (a flag, its value, an
// argument): slimebench exits 2 for it, before it measures anything, and
// 1 for a failure of the work itself.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// usagef makes a usageError; its message starts with the command's name
// and names the flag and its value.
func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// parseFlags parses a command's flags (fs is named "slimebench CMD"): a
// flag the parser refuses, and with positional false any argument left
// over, is a usage error that names the command.
func parseFlags(fs *pflag.FlagSet, args []string, positional bool) error {
	cmd := strings.TrimPrefix(fs.Name(), "slimebench ")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return err
		}
		return usagef("%s: %v", cmd, err)
	}
	if !positional && fs.NArg() > 0 {
		return usagef("%s: unexpected arguments %q", cmd, fs.Args())
	}
	return nil
}

// maxChannels bounds every --channels: p2p.MaxChannels, which the
// transport's links share.
const maxChannels = p2p.MaxChannels

// checkChannels refuses a --channels value out of 1 … maxChannels (0 the
// default where orDefault).
func checkChannels(cmd string, ch int, orDefault bool) error {
	if orDefault && (ch < 0 || ch > maxChannels) {
		return usagef("%s: --channels %d: want 1 to %d (0: the default)", cmd, ch, maxChannels)
	}
	if !orDefault && (ch < 1 || ch > maxChannels) {
		return usagef("%s: --channels %d: want 1 to %d", cmd, ch, maxChannels)
	}
	return nil
}

// checkPlot refuses, before anything runs, a --plot file (empty: none)
// whose directory this process cannot write. Only the rank that plots
// checks: rank 0 of a launcher's ranks (RANK unset or 0), or this process
// with in-process ranks.
func checkPlot(cmd, file string, inProcess bool) error {
	if r := os.Getenv("RANK"); file == "" || !inProcess && r != "" && r != "0" {
		return nil
	}
	if err := unix.Access(filepath.Dir(file), unix.W_OK); err != nil {
		return usagef("%s: --plot %s: its directory is not writable: %v", cmd, file, err)
	}
	return nil
}

// maxInProcess bounds --in-process: every rank is a goroutine of this
// process with its own connections and buffers.
const maxInProcess = 1024

func checkInProcess(cmd string, n int) error {
	if n < 0 || n > maxInProcess {
		return usagef("%s: --in-process %d: want 1 to %d ranks (0: the launcher's ranks)", cmd, n, maxInProcess)
	}
	return nil
}

// fitSweep refuses, before anything runs, a sweep whose largest size S
// needs more than an int holds or more memory than is available: a run
// allocates perS·S bytes at once (what names them).
func fitSweep(cmd string, sw sweep, sizes []int64, perS int64, what string) error {
	if len(sizes) == 0 {
		return nil
	}
	s := slices.Max(sizes)
	need := float64(perS) * float64(s)
	if need >= math.MaxInt64 || perS > 0 && s > math.MaxInt64/perS {
		return usagef("%s: --max-bytes %s: %s need %d × %d bytes, more than an int holds: lower --max-bytes", cmd, sw.maxText(), what, perS, s)
	}
	if avail, _, ok := machine.Memory(); ok && int64(need) > avail {
		return usagef("%s: --max-bytes %s: %s need %.1f GiB of memory at once, and %.1f GiB is available: lower --max-bytes", cmd, sw.maxText(), what, need/(1<<30), float64(avail)/(1<<30))
	}
	return nil
}

func usage() {
	fmt.Fprint(os.Stderr, `usage: slimebench COMMAND [flags]

commands:
  allgather   AllGather sweep (run it under slimerun, torchrun or mpirun)
  memcpy      copy bandwidth at the same sizes, one core or --threads N: the ceiling
  d2d         GPU device-to-device copy bandwidth: the GPU all-gather's ceiling
  tcp         raw TCP latency and bandwidth between two ranks (one per node)
  link        AllGather between two nodes beside raw TCP on the same link, interleaved
  p2p         the p2p engine's reads and writes between two ranks, beside raw TCP and memcpy
  overlap     AllGather+GEMM: t_comm, t_gemm, t_seq, t_overlap, efficiency
  gemm        GFLOP/s of the GEMM the overlap uses (gonum, or OpenBLAS with -tags openblas)
  compare     CSV files side by side, the first as the base, with time ratios

run 'slimebench COMMAND --help' for its flags
`)
}

type sweep struct {
	fs               *pflag.FlagSet
	min, max, factor *string
	// grid: the sizes are min … max by factor even when no flag is given
	// (else the command's list, defaultSizes or its own).
	grid bool
}

// The sweep flags' values where one of them is given and these are not.
// The help shows no default: without any of them the sweep is a list
// (defaultSizes, or the command's), which no values of theirs give.
const sweepMin, sweepMax, sweepFactor = "8", "64M", "8"

// sweepFlags are the flags of a sweep whose sizes, when none is given,
// are the list list (defaultSizes, or the command's own).
func sweepFlags(fs *pflag.FlagSet, list []int64) sweep {
	names := make([]string, len(list))
	for i, n := range list {
		names[i] = bytesize.Format(n)
	}
	return sweep{
		fs: fs,
		min: fs.StringP("min-bytes", "b", "", "smallest per-rank size (suffixes K, M, G). Without -b, -e and -f the sizes are "+
			strings.Join(names, ", ")+"; -b or -e alone: docs/BENCHMARKS.md's sizes between the bounds, and the bounds; "+
			"-f: nccl-tests' grid, -b, -b·f, … up to -e (-b 8, -e 64M where not given)"),
		max:    fs.StringP("max-bytes", "e", "", "largest per-rank size (see --min-bytes)"),
		factor: fs.StringP("step-factor", "f", "", "multiply the size by this between steps (see --min-bytes)"),
	}
}

// value is a sweep flag's value: def where it is not given (a grid's
// flags have their defaults already).
func (s sweep) value(name string, p *string, def string) string {
	if s.grid || s.fs.Changed(name) {
		return *p
	}
	return def
}

// maxText is --max-bytes as the sweep reads it.
func (s sweep) maxText() string { return s.value("max-bytes", s.max, sweepMax) }

// gridFlags are sweep flags whose defaults, min … max by factor, are the
// sweep when none is given.
func gridFlags(fs *pflag.FlagSet, min, max, factor, what string) sweep {
	return sweep{
		fs:     fs,
		min:    fs.StringP("min-bytes", "b", min, "smallest "+what+" (suffixes K, M, G)"),
		max:    fs.StringP("max-bytes", "e", max, "largest "+what),
		factor: fs.StringP("step-factor", "f", factor, "multiply the size by this between steps"),
		grid:   true,
	}
}

// defaultSizes is docs/BENCHMARKS.md's sweep.
var defaultSizes = []int64{8, 64, 512, 4 << 10, 32 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20}

// linkSizes are tcp's and link's sizes where no sweep flag is given.
var linkSizes = []int64{1 << 20, 4 << 20, 16 << 20, 64 << 20}

func (s sweep) sizes() ([]int64, error) {
	if !s.grid && !s.fs.Changed("min-bytes") && !s.fs.Changed("max-bytes") && !s.fs.Changed("step-factor") {
		return defaultSizes, nil
	}
	cmd := strings.TrimPrefix(s.fs.Name(), "slimebench ")
	minB, maxB := s.value("min-bytes", s.min, sweepMin), s.maxText()
	factor := s.value("step-factor", s.factor, sweepFactor)
	lo, err := bytesize.Parse(minB)
	if err != nil {
		return nil, usagef("%s: --min-bytes %q: %v", cmd, minB, err)
	}
	hi, err := bytesize.Parse(maxB)
	if err != nil {
		return nil, usagef("%s: --max-bytes %q: %v", cmd, maxB, err)
	}
	f, err := strconv.ParseFloat(factor, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return nil, usagef("%s: --step-factor %q: want a finite number", cmd, factor)
	}
	sizes, err := bench.Sizes(lo, hi, f)
	if err != nil {
		return nil, usagef("%s: --min-bytes %s, --max-bytes %s, --step-factor %s: %w", cmd, minB, maxB, factor, err)
	}
	if !s.grid && !s.fs.Changed("step-factor") {
		// Bounds alone: BENCHMARKS.md's sizes between them, and the bounds
		// themselves (a step factor gives nccl-tests' grid instead:
		// min, min·f, … up to max).
		sizes = []int64{lo}
		for _, n := range defaultSizes {
			if n > lo && n < hi {
				sizes = append(sizes, n)
			}
		}
		if hi > lo {
			sizes = append(sizes, hi)
		}
	}
	return sizes, nil
}

func allgather(args []string) error {
	fs := pflag.NewFlagSet("slimebench allgather", pflag.ContinueOnError)
	sw := sweepFlags(fs, defaultSizes)
	iters := fs.IntP("iters", "n", 0, "timed iterations per size (default: at least 5 and 0.2 s)")
	warmup := fs.IntP("warmup", "w", 0, "warm-up iterations per size (default: at least 5 and 0.1 s)")
	mode := fs.String("mode", "auto", "intra, inter or auto")
	backend := fs.String("backend", "auto", "cpu, cuda or auto")
	eager := fs.Bool("eager-mode", false, "launch without CUDA graphs (the CPU backend always does)")
	buffers := fs.String("buffers", "symmetric", "symmetric (Communicator.Alloc, read in place) or plain (staged)")
	channels := fs.Int("channels", 0, "TCP connections per peer pair across nodes (default: SLIME_CHANNELS, else 4)")
	algo := fs.String("algo", "", "across nodes: auto, hier or ring (default: SLIME_ALGO, else auto: hier where every node holds as many ranks, else ring)")
	asCSV := fs.Bool("csv", false, "print CSV instead of the table")
	asJSON := fs.Bool("json", false, "print JSON instead of the table")
	quiet := fs.Bool("quiet", false, "no progress on stderr")
	inProcess := fs.Int("in-process", 0, "run this many ranks of one node as goroutines of this process, without a launcher")
	ceiling := fs.Bool("ceiling", false, "after every timed out-of-place call, each rank also copies its source into each block of its "+
		"destination, timed alike (rows named ceiling): with a rank per core, the copy bound of the all-gather, taken beside it "+
		"(host memory on one node; elsewhere no rows)")
	if err := parseFlags(fs, args, false); err != nil {
		return err
	}
	if err := checkInProcess("allgather", *inProcess); err != nil {
		return err
	}
	if *iters < 0 || *iters > bench.MaxIters {
		return usagef("allgather: --iters %d: want 1 to %d (0: at least 5 and 0.2 s)", *iters, bench.MaxIters)
	}
	if *warmup < 0 || *warmup > bench.MaxIters {
		return usagef("allgather: --warmup %d: want 1 to %d (0: at least 5 and 0.1 s)", *warmup, bench.MaxIters)
	}
	if err := checkChannels("allgather", *channels, true); err != nil {
		return err
	}
	if *asCSV && *asJSON {
		return usagef("allgather: --csv and --json: choose one")
	}
	if err := checkMode("allgather", *mode); err != nil {
		return err
	}
	if a := *algo; a != "" && !collective.ValidAlgo(a) {
		return usagef("allgather: --algo %q: want auto, hier or ring", a)
	}
	sizes, err := sw.sizes()
	if err != nil {
		return err
	}
	kind, err := resolveBackend(*backend)
	if err != nil {
		return usagef("allgather: --backend %q: %v", *backend, err)
	}
	if *buffers != "symmetric" && *buffers != "plain" {
		return usagef("allgather: --buffers %q: want symmetric or plain", *buffers)
	}
	// Each rank holds its destination and source (P·S and S bytes) and
	// their copies in host memory to fill and check: 2·(P+1)·S of host
	// memory on the CPU, (P+1)·S on CUDA (the buffers are the GPU's), times
	// the ranks of this node (the goroutines of this process with
	// --in-process).
	P, local := ranksHere(*inProcess)
	copies := int64(2)
	if kind == device.CUDA {
		copies = 1
	}
	if err := fitSweep("allgather", sw, sizes, copies*(P+1)*local, fmt.Sprintf("%d rank(s) of %d here", local, P)); err != nil {
		return err
	}
	ctx := context.Background()
	opts := collective.Options{Backend: kind, TCP: collective.TCP{Channels: *channels, Algo: *algo}, CUDA: collective.CUDA{Eager: *eager}}
	if *inProcess > 0 {
		return inProcessRanks(ctx, *inProcess, opts, func(c *collective.Communicator) error {
			return allgatherRank(ctx, c, *mode, *buffers, *eager, *asCSV, *asJSON, *quiet, bench.Config{Sizes: sizes, Iters: *iters, Warmup: *warmup, Ceiling: *ceiling})
		})
	}
	noteWorldOfOne("allgather")
	c, err := collective.Init(ctx, opts)
	if err != nil {
		return err
	}
	defer c.Close()
	return allgatherRank(ctx, c, *mode, *buffers, *eager, *asCSV, *asJSON, *quiet, bench.Config{Sizes: sizes, Iters: *iters, Warmup: *warmup, Ceiling: *ceiling})
}

// noteWorldOfOne says on stderr that cmd runs a world of one rank where
// no launcher set the world's size (the variables collective.LoadEnv
// reads it from): a figure of one rank, which gathers nothing, is no
// all-gather's.
func noteWorldOfOne(cmd string) {
	for _, v := range []string{"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", "PMI_SIZE"} {
		if os.Getenv(v) != "" {
			return
		}
	}
	fmt.Fprintf(os.Stderr, "slimebench %s: no launcher (WORLD_SIZE unset): a world of 1 rank, which gathers nothing; run it under slimerun (slimerun --standalone --nproc-per-node 2 slimebench %s ...) or with --in-process N\n", cmd, cmd)
}

// allgatherRank runs the sweep on one rank; rank 0 prints.
func allgatherRank(ctx context.Context, c *collective.Communicator, mode, buffers string, eager, asCSV, asJSON, quiet bool, cfg bench.Config) error {
	m, err := resolveMode(mode, c)
	if err != nil {
		return err
	}
	cfg.Symmetric, cfg.Backend, cfg.Mode = buffers == "symmetric", c.Backend().String(), m
	if cfg.Ceiling && !bench.CeilingApplies(c) && c.Rank() == 0 {
		fmt.Fprintf(os.Stderr, "slimebench: --ceiling adds no rows here: it bounds the copies of one node's all-gather in host memory (backend %s, %d nodes)\n",
			c.Backend(), c.Nodes())
	}
	start := time.Now()
	if !quiet {
		cfg.Progress = func(done, total int, r bench.Result) {
			fmt.Fprintf(os.Stderr, "slimebench: [%d/%d] %s per rank, out of place: %.2f µs, busbw %.3f GB/s (%d iterations; %v elapsed)\n",
				done, total, bytesize.Format(r.S), r.Median, r.BusBW, r.Iters, time.Since(start).Round(time.Millisecond))
		}
	}
	rs, err := bench.AllGather(ctx, c, cfg)
	if err != nil {
		return err
	}
	if c.Rank() != 0 {
		return nil
	}
	// A wrong byte fails the run whatever the format: the rows still go
	// out (marked in their wrong column), and the exit says so.
	wrong := func() error {
		for _, r := range rs {
			if r.Wrong != 0 {
				return fmt.Errorf("%d wrong bytes at %d bytes per rank", r.Wrong, r.S)
			}
		}
		return nil
	}
	switch {
	case asCSV:
		return errors.Join(bench.WriteCSV(os.Stdout, rs), wrong())
	case asJSON:
		return errors.Join(bench.WriteJSON(os.Stdout, rs), wrong())
	}
	launch, bufs := "eager (cpu)", buffers
	if c.Backend() == device.CUDA {
		launch, bufs = planModes(rs), "device"
		if launch == "eager" && (eager || c.Options().Eager) {
			launch = "eager (--eager-mode)"
		}
		launch += " on " + c.Device().String()
	}
	var ceil []bench.Result
	for _, set := range bench.ByImpl(rs) {
		if set[0].Impl == bench.CeilingImpl {
			ceil = set
		} else {
			rs = set
		}
	}
	bench.WriteTable(os.Stdout, rs, fmt.Sprintf("slimego allgather: P=%d nodes=%d backend=%s mode=%s buffers=%s launch=%s%s", c.Size(), c.Nodes(), backendLabel(c), m, bufs, launch, c.Describe()))
	if len(ceil) > 0 {
		fmt.Println("# ceiling: the copies alone, each rank copying its source into every block of its destination between the calls out of place;")
		fmt.Println("# share: its time over the all-gather's (the fraction of the copy bound reached)")
		fmt.Printf("#%12s %9s %7s %6s\n", "size (B)", "time (us)", "busbw", "share")
		for _, r := range ceil {
			for _, o := range rs {
				if o.S == r.S && !o.InPlace {
					fmt.Printf(" %12d %9.2f %7.3f %5.0f%%\n", r.S, r.Median, r.BusBW, 100*r.Median/o.Median)
				}
			}
		}
	}
	return wrong()
}

// planModes says how rs's plans ran, each mode once in the order met:
// what their mode column says after the slash (graph, eager, staged across
// nodes, host-staged where the node's GPUs cannot reach each other), as
// the CSV's rows say it.
func planModes(rs []bench.Result) string {
	var modes []string
	for _, r := range rs {
		if _, m, ok := strings.Cut(r.Mode, "/"); ok && !slices.Contains(modes, m) {
			modes = append(modes, m)
		}
	}
	if len(modes) == 0 {
		return "host"
	}
	return strings.Join(modes, "+")
}

// inProcessRanks runs n ranks of one node as goroutines of this process
// (collective.RunInProcess): on a GPU they share one CUDA context, so
// their kernels run side by side instead of time-slicing as processes do
// without MPS.
func inProcessRanks(ctx context.Context, n int, opts collective.Options, body func(c *collective.Communicator) error) error {
	errs := collective.RunInProcess(ctx, 1, n, func(o *collective.Options) {
		o.Backend, o.Channels, o.Algo, o.Eager = opts.Backend, opts.Channels, opts.Algo, opts.Eager
	}, body)
	for r, err := range errs {
		if err != nil {
			errs[r] = fmt.Errorf("rank %d: %w", r, err)
		}
	}
	return errors.Join(errs...)
}

func memcpy(args []string) error {
	fs := pflag.NewFlagSet("slimebench memcpy", pflag.ContinueOnError)
	sw := sweepFlags(fs, defaultSizes)
	asCSV := fs.Bool("csv", false, "print CSV (impl memcpy, P = threads) instead of the table")
	threads := fs.Int("threads", 1, "threads that copy each size together, each its own share (2: the bound of two ranks out of place)")
	gather := fs.Bool("gather", false, "the all-gather's copies instead: each of --threads threads gathers --threads blocks of the size "+
		"(in place, the others' blocks only), rows named memcpy-gather with the all-gather's P, S and bandwidths and every destination checked (#wrong), "+
		"to set beside its rows in slimebench compare (the ratio is then the share of this bound reached)")
	if err := parseFlags(fs, args, false); err != nil {
		return err
	}
	// Each thread polls for the others: with more threads than CPUs the
	// time measured is the scheduler's, far above the copy's.
	if cpus := machine.OnlineCPUs(); *threads < 1 || *threads > cpus {
		return usagef("memcpy: --threads %d: want 1 to %d, this machine's online CPUs (the threads poll for one another: with more threads than CPUs the time is the scheduler's, not the copy's)", *threads, cpus)
	}
	sizes, err := sw.sizes()
	if err != nil {
		return err
	}
	perS, what := int64(2), "a source and a destination"
	if *gather {
		perS, what = int64(*threads)*int64(*threads+1), fmt.Sprintf("%d sources and %d destinations of %d blocks", *threads, *threads, *threads)
	}
	if err := fitSweep("memcpy", sw, sizes, perS, what); err != nil {
		return err
	}
	if *gather {
		var rs []bench.Result
		for _, n := range sizes {
			for _, inPlace := range []bool{false, true} {
				r := bench.Result{Impl: "memcpy-gather", Backend: "cpu", Mode: "intra", P: *threads, Nodes: 1, S: n, InPlace: inPlace}
				r.Median, r.Wrong = bench.GatherCopy(int(n), *threads, inPlace, 200*time.Millisecond)
				r.Bandwidths()
				rs = append(rs, r)
			}
		}
		var wrong int64
		for _, r := range rs {
			wrong += r.Wrong
		}
		var err error
		if wrong != 0 {
			err = fmt.Errorf("memcpy: %d wrong bytes in the gathered copies", wrong)
		}
		if *asCSV {
			return errors.Join(bench.WriteCSV(os.Stdout, rs), err)
		}
		bench.WriteTable(os.Stdout, rs, fmt.Sprintf("the all-gather's copies alone, %d threads each gathering %d blocks", *threads, *threads))
		return err
	}
	mode := "single-core"
	if *threads > 1 {
		mode = fmt.Sprintf("%d-threads", *threads)
	}
	var rs []bench.Result
	for _, n := range sizes {
		us, gbps := bench.MemcpyThreads(int(n), *threads, 200*time.Millisecond)
		rs = append(rs, bench.Result{Impl: "memcpy", Backend: "cpu", Mode: mode, P: *threads, Nodes: 1, S: n, Median: us, AlgBW: gbps, BusBW: gbps, Unchecked: true})
	}
	if *asCSV {
		return bench.WriteCSV(os.Stdout, rs)
	}
	fmt.Printf("# memcpy between reused buffers, %d thread(s) each copying its share of the size\n#%12s %10s %9s\n", *threads, "size (B)", "time (us)", "GB/s")
	for _, r := range rs {
		fmt.Printf(" %12d %10.2f %9.3f\n", r.S, r.Median, r.BusBW)
	}
	return nil
}

func d2d(args []string) error {
	fs := pflag.NewFlagSet("slimebench d2d", pflag.ContinueOnError)
	sw := sweepFlags(fs, defaultSizes)
	ordinal := fs.Int("device", 0, "GPU ordinal")
	asCSV := fs.Bool("csv", false, "print CSV (impl d2d, busbw = GB/s copied) instead of the table")
	if err := parseFlags(fs, args, false); err != nil {
		return err
	}
	sizes, err := sw.sizes()
	if err != nil {
		return err
	}
	gpu, err := device.OpenGPU(*ordinal)
	if err != nil {
		return err
	}
	var rs []bench.Result
	for _, n := range sizes {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hung GPU is an error, not a hang
		us, gbps, err := bench.D2D(ctx, gpu, int(n), 200*time.Millisecond)
		cancel()
		if err != nil {
			return err
		}
		rs = append(rs, bench.Result{Impl: "d2d", Backend: bench.D2DBackend(gpu), Mode: "copy", P: 1, Nodes: 1, S: n, Median: us, AlgBW: gbps, BusBW: gbps, Unchecked: true})
	}
	if *asCSV {
		return bench.WriteCSV(os.Stdout, rs)
	}
	fmt.Printf("# device-to-device copy on %s (cudaMemcpyAsync, back to back, CUDA events)\n", gpu)
	if gpu.Emulated() {
		fmt.Printf("# %s\n", bench.EmulatedNote)
	}
	fmt.Printf("#%12s %10s %9s\n", "size (B)", "time (us)", "GB/s")
	for _, r := range rs {
		fmt.Printf(" %12d %10.2f %9.3f\n", r.S, r.Median, r.BusBW)
	}
	return nil
}

func tcp(args []string) error {
	fs := pflag.NewFlagSet("slimebench tcp", pflag.ContinueOnError)
	sw := sweepFlags(fs, linkSizes)
	channels := fs.IntSlice("channels", []int{1, 2, 4}, "connections to stripe each transfer over (one sweep each)")
	asCSV := fs.Bool("csv", false, "print CSV (impl tcp-N[-duplex][-lowatB], busbw = link GB/s; tcp-1-latency: the 8-byte ping-pong, median_us half a round trip) instead of the table")
	lowats := fs.StringSlice("lowat", []string{"0", "4M"}, "receive low-water mark bounds to measure (0: plain reads; see inter.Reader)")
	if err := parseFlags(fs, args, false); err != nil {
		return err
	}
	for _, ch := range *channels {
		if err := checkChannels("tcp", ch, false); err != nil {
			return err
		}
	}
	var lws []int
	for _, v := range *lowats {
		n, err := bytesize.Parse(v)
		if err != nil {
			return usagef("tcp: --lowat %q: %v", v, err)
		}
		lws = append(lws, int(n))
	}
	sizes := linkSizes
	if fs.Changed("min-bytes") || fs.Changed("max-bytes") || fs.Changed("step-factor") {
		var err error
		if sizes, err = sw.sizes(); err != nil {
			return err
		}
	}
	// Each rank sends from one buffer and receives into another.
	if err := fitSweep("tcp", sw, sizes, 2*localRanks(), "a send and a receive buffer per rank here"); err != nil {
		return err
	}
	ctx := context.Background()
	c, err := collective.Init(ctx, collective.Options{})
	if err != nil {
		return err
	}
	defer c.Close()
	var rows []bench.TCPResult
	first := true
	for _, duplex := range []bool{false, true} {
		for _, ch := range *channels {
			for _, lw := range lws {
				rs, err := bench.TCP(ctx, c, os.Getenv("MASTER_ADDR"), sizes, ch, duplex, lw, 200*time.Millisecond)
				if err != nil {
					return err
				}
				if !first {
					rs = rs[1:] // latency once
				}
				first = false
				rows = append(rows, rs...)
			}
		}
	}
	if c.Rank() != 0 {
		return nil
	}
	if *asCSV {
		var rs []bench.Result
		for _, r := range rows {
			impl := fmt.Sprintf("tcp-%d", r.Channels)
			if r.Latency {
				impl += "-latency"
			}
			if r.Duplex {
				impl += "-duplex"
			}
			if r.Lowat > 0 {
				impl += "-lowat" + bytesize.Format(int64(r.Lowat))
			}
			rs = append(rs, bench.Result{Impl: impl, Backend: "cpu", Mode: "inter", P: 2, Nodes: c.Nodes(),
				S: r.S, Median: r.Median, AlgBW: r.GBps, BusBW: r.GBps, Unchecked: true})
		}
		return bench.WriteCSV(os.Stdout, rs)
	}
	fmt.Printf("# raw TCP between rank 0 (node %d) and rank 1, sockets as slimego's transport sets them\n", 0)
	fmt.Printf("# duplex: both ranks send at once, as an all-gather does; GB/s per direction\n")
	fmt.Printf("# lowat: receives wake per that many bytes (SO_RCVLOWAT), 0 per segment\n")
	fmt.Printf("#%12s %9s %8s %8s %11s %9s\n", "size (B)", "channels", "duplex", "lowat", "time (us)", "GB/s")
	for _, r := range rows {
		if r.Latency {
			fmt.Printf(" %12d %9d %8v %8s %11.2f %9s   one-way latency\n", r.S, r.Channels, false, "-", r.Median, "-")
			continue
		}
		fmt.Printf(" %12d %9d %8v %8s %11.2f %9.3f\n", r.S, r.Channels, r.Duplex, bytesize.Format(int64(r.Lowat)), r.Median, r.GBps)
	}
	return nil
}

// maxConcurrency bounds slimebench p2p's --concurrency.
const maxConcurrency = 1024

func p2pCmd(args []string) error {
	fs := pflag.NewFlagSet("slimebench p2p", pflag.ContinueOnError)
	sw := gridFlags(fs, "2K", "128M", "2", "bytes per operation (DLSlime's grid: 2K … 128M by ×2)")
	batches := fs.IntSlice("batch", []int{1, 64}, "operations per batched call (one sweep each)")
	conc := fs.IntSlice("concurrency", []int{1, 8}, "batches in flight at once (one sweep each)")
	ops := fs.StringSlice("op", []string{"read", "write"}, "read, write, writeimm (WriteWithImm: each batch ends with an immediate the target takes in)")
	tcpOnly := fs.Bool("tcp-only", false, "carry every transfer over TCP, even to a peer on this host")
	shared := fs.Bool("shared", false, "register each rank's region as p2p.Shared memory, which a peer on this host maps and copies itself (transport shm)")
	symmetric := fs.Bool("symmetric", false, "register each rank's part of symmetric memory (collective Alloc, a file in /dev/shm) as p2p.Shared memory (MapShared), which a peer on this host maps and copies itself (transport shm)")
	huge := fs.Bool("huge", false, "register each rank's region as plain memory from a mapping advised to use transparent huge pages (MADV_HUGEPAGE; transport cma on one host)")
	gpu := fs.Bool("gpu", false, "register each rank's region as GPU memory (device LOCAL_RANK mod the devices), copied device to device through CUDA IPC on one host (transport ipc), staged through host memory over TCP otherwise; no paired baselines")
	channels := fs.Int("channels", p2p.DefaultChannels, fmt.Sprintf("TCP connections of the link, p2p's and the raw baseline's (1 to %d)", p2p.MaxChannels))
	inFlight := fs.String("max-in-flight", "256M", "skip combinations moving more bytes at once than this (size x batch x concurrency)")
	register := fs.String("register", "1G", "memory whose registration is timed, as 4K pages and as one region (0: none; else a multiple of 4K, 8K or more)")
	noBase := fs.Bool("no-baselines", false, "leave out raw TCP, the 8-byte read and memcpy")
	minTime := fs.Duration("min-time", 200*time.Millisecond, "timed time per combination (at least 5 rounds, at most 2000)")
	asCSV := fs.Bool("csv", false, "print CSV ("+strings.Join(bench.P2PCSVHeader, ",")+") instead of the table")
	plotFile := fs.String("plot", "", "write a PNG of GB/s against S")
	quiet := fs.Bool("quiet", false, "no progress lines on stderr")
	if err := parseFlags(fs, args, false); err != nil {
		return err
	}
	if kinds := btoi(*gpu) + btoi(*shared) + btoi(*symmetric) + btoi(*huge); kinds > 1 {
		return usagef("p2p: one of --gpu, --shared, --symmetric and --huge: one kind of memory")
	}
	if *tcpOnly && (*shared || *symmetric) {
		return usagef("p2p: --shared and --symmetric measure the copies a peer on this host makes through its own mapping, which --tcp-only turns off")
	}
	for _, b := range *batches {
		if b < 1 || b > p2p.MaxBatch {
			return usagef("p2p: --batch %d: want 1 to %d operations", b, p2p.MaxBatch)
		}
	}
	for _, k := range *conc {
		if k < 1 || k > maxConcurrency {
			return usagef("p2p: --concurrency %d: want 1 to %d batches in flight", k, maxConcurrency)
		}
	}
	if err := checkChannels("p2p", *channels, false); err != nil {
		return err
	}
	if *minTime <= 0 {
		return usagef("p2p: --min-time %v: want a positive duration", *minTime)
	}
	if err := checkPlot("p2p", *plotFile, false); err != nil {
		return err
	}
	cfg := bench.P2PConfig{Batches: *batches, Concurrency: *conc, Ops: *ops, TCPOnly: *tcpOnly, Shared: *shared, Symmetric: *symmetric, Huge: *huge, GPU: *gpu, Channels: *channels, MinTime: *minTime, Baselines: !*noBase}
	for _, op := range *ops {
		if op != "read" && op != "write" && op != "writeimm" {
			return usagef("p2p: --op %q: want read, write or writeimm", op)
		}
	}
	var err error
	if cfg.Sizes, err = sw.sizes(); err != nil {
		return err
	}
	if cfg.Sizes[0] < 1 { // the engine refuses an operation of 0 bytes
		return usagef("p2p: --min-bytes %s: want 1 byte or more (an operation moves something)", *sw.min)
	}
	n, err := bytesize.Parse(*inFlight)
	if err == nil && n <= 0 {
		err = errors.New("want a positive size")
	}
	if err != nil {
		return usagef("p2p: --max-in-flight %q: %v", *inFlight, err)
	}
	cfg.MaxInFlight = n
	if cfg.RegisterBytes, err = bytesize.Parse(*register); err != nil {
		return usagef("p2p: --register %q: %v", *register, err)
	}
	if err := bench.CheckRegisterBytes(cfg.RegisterBytes); err != nil {
		return usagef("p2p: --register %q: %v", *register, err)
	}
	hugeNote := ""
	if *huge {
		cfg.OnRegion = func(region []byte) {
			got := "an unknown part"
			if n := machine.HugeBytes(region); n >= 0 {
				got = bytesize.Format(n)
			}
			hugeNote = fmt.Sprintf(" (huge pages: %s of %s on rank 0, transparent huge pages %q)",
				got, bytesize.Format(int64(len(region))), machine.THP())
		}
	}
	ctx := context.Background()
	c, err := collective.Init(ctx, collective.Options{})
	if err != nil {
		return err
	}
	defer c.Close()
	if err := bench.P2PWorld(c); err != nil {
		return err // before the sweep's notes, which would bury it
	}
	if c.Rank() == 0 {
		if *gpu && device.CUDAEmulated() {
			fmt.Fprintln(os.Stderr, "slimebench p2p: --gpu on the emulated CUDA library: no figure here is a GPU's")
		}
		for _, s := range cfg.Skipped() {
			fmt.Fprintf(os.Stderr, "slimebench p2p: skipped %s (over --max-in-flight %s)\n", s, *inFlight)
		}
		if !*quiet {
			cfg.Progress = func(r bench.P2PResult) {
				// As the table: '-' for what the row does not measure.
				gbps, wrong := "-", "-"
				if r.GBps != 0 {
					gbps = strconv.FormatFloat(r.GBps, 'f', 3, 64)
				}
				if !r.Unchecked {
					wrong = strconv.FormatInt(r.Wrong, 10)
				}
				fmt.Fprintf(os.Stderr, "slimebench p2p: %s %s %s S=%s batch=%d concurrency=%d: %s GB/s p50 %.1f us wrong %s\n",
					r.Impl, r.Transport, r.Op, bytesize.Format(r.S), r.Batch, r.Concurrency, gbps, r.P50, wrong)
			}
		}
	}
	reported := false
	cfg.Failed = func(err error) {
		fmt.Fprintln(os.Stderr, "slimebench:", err)
		reported = true
	}
	rs, err := bench.P2P(ctx, c, cfg)
	if err != nil {
		if reported {
			return reportedError{err}
		}
		return err
	}
	if c.Rank() != 0 {
		return nil
	}
	memory := "host"
	switch {
	case *shared:
		memory = "shared"
	case *symmetric:
		memory = "symmetric"
	case *huge:
		memory = "host" + hugeNote
	case *gpu:
		memory = "gpu"
		if device.CUDAEmulated() {
			memory = "gpu (EMULATED: no figure here is a GPU's)"
		}
	}
	title := fmt.Sprintf("slimebench p2p: rank 1 reads/writes rank 0's region, %d node(s), tcp-only %v, memory %s, %s", c.Nodes(), *tcpOnly, memory, time.Now().UTC().Format("2006-01-02"))
	if *asCSV {
		if err := bench.WriteP2PCSV(os.Stdout, rs); err != nil {
			return err
		}
		for _, l := range bench.P2PTargets(rs) {
			fmt.Fprintln(os.Stderr, "# "+l) // as the table ends
		}
	} else {
		bench.WriteP2PTable(os.Stdout, rs, title)
	}
	if *plotFile != "" {
		if err := bench.PlotP2P(rs, title, *plotFile); err != nil {
			return err
		}
	}
	var wrong int64
	for _, r := range rs {
		wrong += r.Wrong
	}
	if wrong != 0 {
		return fmt.Errorf("p2p: %d wrong bytes", wrong)
	}
	return nil
}

func linkCmd(args []string) error {
	fs := pflag.NewFlagSet("slimebench link", pflag.ContinueOnError)
	sw := sweepFlags(fs, linkSizes)
	channels := fs.Int("channels", 0, "TCP connections per peer pair, the transport's and the raw link's (default: SLIME_CHANNELS, else 4)")
	lowat := fs.String("lowat", "", "receive low-water mark bound, the transport's and the raw link's (default: SLIME_RCVLOWAT, else 4M; -1: none)")
	minIters := fs.IntP("iters", "n", 5, "least timed iterations per size (each times the link twice and the all-gather out of place and in place)")
	minTime := fs.Duration("min-time", time.Second, "time each way fills per size, at least")
	asCSV := fs.Bool("csv", false, "print CSV rows of docs/BENCHMARKS.md (impl tcp-N-duplex[-lowatB], slimego, slimego/in-place) instead of the table")
	quiet := fs.Bool("quiet", false, "no progress on stderr")
	if err := parseFlags(fs, args, false); err != nil {
		return err
	}
	if err := checkChannels("link", *channels, true); err != nil {
		return err
	}
	if *minIters < 1 || *minIters > bench.MaxIters {
		return usagef("link: --iters %d: want 1 to %d", *minIters, bench.MaxIters)
	}
	if *minTime < 0 {
		return usagef("link: --min-time %v: want 0 or more", *minTime)
	}
	sizes := linkSizes
	if fs.Changed("min-bytes") || fs.Changed("max-bytes") || fs.Changed("step-factor") {
		var err error
		if sizes, err = sw.sizes(); err != nil {
			return err
		}
	}
	// Each rank holds a gather's destination (2 blocks) and source in
	// symmetric memory, and the raw transfer's send and receive buffers.
	if err := fitSweep("link", sw, sizes, 5*localRanks(), "a gather's buffers and a send and a receive buffer per rank here"); err != nil {
		return err
	}
	opts := collective.Options{TCP: collective.TCP{Channels: *channels}}
	if *lowat != "" {
		n, err := bytesize.Parse(strings.TrimPrefix(*lowat, "-"))
		if err != nil {
			return usagef("link: --lowat %q: %v", *lowat, err)
		}
		if opts.RcvLowat = int(n); strings.HasPrefix(*lowat, "-") || n == 0 {
			opts.RcvLowat = -1
		}
	}
	ctx := context.Background()
	c, err := collective.Init(ctx, opts)
	if err != nil {
		return err
	}
	defer c.Close()
	if c.Nodes() != 2 || c.Size() != 2 {
		return fmt.Errorf("link: run one rank on each of two nodes (this job: %d ranks on %d nodes)", c.Size(), c.Nodes())
	}
	// The raw link is set up as the communicator's transport is.
	ch, lw := c.Channels(), c.Options().RcvLowat
	if lw == 0 {
		lw = inter.DefaultLowat
	}
	start := time.Now()
	var progress func(done, total int, r bench.LinkResult)
	if !*quiet {
		progress = func(done, total int, r bench.LinkResult) {
			fmt.Fprintf(os.Stderr, "slimebench: [%d/%d] %s per rank: link %.3f GB/s, busbw %.3f (%.0f%%), in place %.3f (%.0f%%) (%d iterations; %v elapsed)\n",
				done, total, bytesize.Format(r.S), r.LinkGBps(), r.BusBW(false), 100*r.RatioOut, r.BusBW(true), 100*r.RatioIn, r.Iters, time.Since(start).Round(time.Millisecond))
		}
	}
	rs, err := bench.Link(ctx, c, os.Getenv("MASTER_ADDR"), sizes, ch, max(lw, 0), *minIters, *minTime, progress)
	if err != nil {
		return err
	}
	if c.Rank() != 0 {
		return nil
	}
	wrong := int64(0)
	for _, r := range rs {
		wrong += r.Wrong + r.WrongIn
	}
	if *asCSV {
		impl := fmt.Sprintf("tcp-%d-duplex", ch)
		if lw > 0 {
			impl += "-lowat" + bytesize.Format(int64(lw))
		}
		var out []bench.Result
		for _, r := range rs {
			base := bench.Result{Backend: "cpu", Mode: "inter", P: 2, Nodes: 2, S: r.S}
			link, oop, ip := base, base, base
			link.Impl, link.Median, link.Unchecked = impl, r.Link, true
			link.AlgBW, link.BusBW = r.LinkGBps(), r.LinkGBps()
			oop.Impl, oop.Median, oop.Wrong = "slimego", r.Out, r.Wrong
			ip.Impl, ip.Median, ip.Wrong, ip.InPlace = "slimego", r.In, r.WrongIn, true
			oop.Bandwidths()
			ip.Bandwidths()
			out = append(out, link, oop, ip)
		}
		if err := bench.WriteCSV(os.Stdout, out); err != nil {
			return err
		}
	} else {
		fmt.Printf("# slimego allgather beside the link it runs over: 2 nodes x 1 rank%s lowat=%s\n", c.Describe(), bytesize.Format(int64(max(lw, 0))))
		fmt.Printf("# link: duplex transfer of S bytes each way on %d plain TCP connections set up as the transport's, GB/s per direction\n", ch)
		fmt.Printf("# link, out of place, link, in place alternate within every iteration; ratio = median over iterations of busbw / the preceding link run's bandwidth\n")
		fmt.Printf("#%12s %6s %10s %10s %10s %7s %7s %10s %7s %7s\n", "size (B)", "iters", "link (us)", "link GB/s", "time (us)", "busbw", "ratio", "in-place", "busbw", "ratio")
		for _, r := range rs {
			fmt.Printf(" %12d %6d %10.1f %10.3f %10.1f %7.3f %6.0f%% %10.1f %7.3f %6.0f%%\n", r.S, r.Iters, r.Link, r.LinkGBps(),
				r.Out, r.BusBW(false), 100*r.RatioOut, r.In, r.BusBW(true), 100*r.RatioIn)
		}
	}
	if wrong != 0 {
		return fmt.Errorf("%d wrong bytes", wrong)
	}
	return nil
}

func overlapCmd(args []string) error {
	fs := pflag.NewFlagSet("slimebench overlap", pflag.ContinueOnError)
	mMin := fs.Int("m-min", 64, "smallest m (rows of A per rank)")
	mMax := fs.Int("m-max", 2048, "largest m; m doubles between steps")
	nks := fs.IntSlice("nk", []int{512}, "k values (columns of A); n = k unless --n is given")
	nFixed := fs.Int("n", 0, "columns of B and C for every shape (default: n = k)")
	dtypes := fs.StringSlice("dtype", []string{"float32"}, "float32, float64 or both")
	pieces := fs.Int("pieces", overlap.DefaultPieces, "pieces the gather is cut into (fewer where a piece would carry less than --min-piece)")
	minPiece := fs.String("min-piece", "", "least a gather piece carries per rank across nodes (suffixes K, M; 0: no least; default: overlap.MinPieceBytes, what fills every connection, 2M with 4); smaller pieces suit a link that the wire, not the processors, bounds")
	iters := fs.Int("iters", 3, "least timed iterations per way and shape (more, up to 200, to fill about 0.2 s)")
	mode := fs.String("mode", "auto", "intra, inter or auto")
	asCSV := fs.Bool("csv", false, "print CSV instead of the table")
	plotFile := fs.String("plot", "", "write a PNG of efficiency against m")
	quiet := fs.Bool("quiet", false, "no progress on stderr")
	backend := fs.String("backend", "auto", "cpu, cuda or auto")
	eager := fs.Bool("eager-mode", false, "launch without CUDA graphs (the CPU backend always does)")
	inProcess := fs.Int("in-process", 0, "run this many ranks of one node as goroutines of this process, without a launcher")
	cpuWindow := fs.Duration("cpu-window", 500*time.Millisecond, "CPU backend: run the gather and the GEMMs alone this long each to measure how busy they keep the machine (0: skip)")
	if err := parseFlags(fs, args, false); err != nil {
		return err
	}
	if err := checkInProcess("overlap", *inProcess); err != nil {
		return err
	}
	if *mMin < 1 {
		return usagef("overlap: --m-min %d: want 1 or more", *mMin)
	}
	if *mMax < *mMin {
		return usagef("overlap: --m-min %d and --m-max %d: want --m-min at most --m-max", *mMin, *mMax)
	}
	if len(*nks) == 0 {
		return usagef("overlap: --nk: want at least one k")
	}
	for _, k := range *nks {
		if k < 1 {
			return usagef("overlap: --nk %d: want 1 or more", k)
		}
	}
	if *nFixed < 0 {
		return usagef("overlap: --n %d: want 1 or more (0: n = k)", *nFixed)
	}
	if len(*dtypes) == 0 {
		return usagef(`overlap: --dtype "": want float32 or float64`)
	}
	for _, dt := range *dtypes {
		if dt != "float32" && dt != "float64" {
			return usagef("overlap: --dtype %q: want float32 or float64", dt)
		}
	}
	if *pieces < 1 {
		return usagef("overlap: --pieces %d: want 1 or more", *pieces)
	}
	if err := checkMode("overlap", *mode); err != nil {
		return err
	}
	if *iters < 1 || *iters > bench.MaxIters {
		return usagef("overlap: --iters %d: want 1 to %d", *iters, bench.MaxIters)
	}
	if *cpuWindow < 0 {
		return usagef("overlap: --cpu-window %v: want 0 (skip) or more", *cpuWindow)
	}
	if err := checkPlot("overlap", *plotFile, *inProcess > 0); err != nil {
		return err
	}
	kind, err := resolveBackend(*backend)
	if err != nil {
		return usagef("overlap: --backend %q: %v", *backend, err)
	}
	piecing := overlap.Options{Pieces: *pieces}
	if *minPiece != "" {
		v, err := bytesize.Parse(*minPiece)
		if err != nil {
			return usagef("overlap: --min-piece %q: %v", *minPiece, err)
		}
		piecing.MinPieceBytes = int(v)
		if v == 0 {
			piecing.MinPieceBytes = -1
		}
	}
	if err := fitOverlap(kind, *inProcess, *mMin, *mMax, *nks, *nFixed, *dtypes); err != nil {
		return err
	}
	ctx := context.Background()
	opts := collective.Options{Backend: kind, CUDA: collective.CUDA{Eager: *eager}}
	sweepRank := func(c *collective.Communicator) error {
		return overlapRank(ctx, c, *mode, *dtypes, *nks, *nFixed, *mMin, *mMax, piecing, *iters, *cpuWindow, *eager, *asCSV, *quiet, *plotFile)
	}
	if *inProcess > 0 {
		return inProcessRanks(ctx, *inProcess, opts, sweepRank)
	}
	noteWorldOfOne("overlap")
	c, err := collective.Init(ctx, opts)
	if err != nil {
		return err
	}
	defer c.Close()
	return sweepRank(c)
}

// fitOverlap refuses, before anything runs, an overlap sweep whose
// largest shape needs more memory than is available on this node. Each
// rank holds A (m×k), B (k×n), the gathered A ((P·m)×k) and C ((P·m)×n),
// and host copies of A and B to write them from: all of it in host memory
// on the CPU backend, the copies alone on CUDA (the GPU's memory is its
// own to refuse); times the ranks on this node.
func fitOverlap(kind device.Kind, inProcess, mMin, mMax int, nks []int, nFixed int, dtypes []string) error {
	avail, _, ok := machine.Memory()
	if !ok {
		return nil
	}
	P, local := ranksHere(inProcess)
	m := mMin // the sweep's largest m: mMin doubled while it stays within mMax
	for m <= mMax/2 {
		m *= 2
	}
	var need float64
	var worst string
	for _, dt := range dtypes {
		esz := 4.0
		if dt == "float64" {
			esz = 8
		}
		for _, k := range nks {
			n := k
			if nFixed > 0 {
				n = nFixed
			}
			M, N, K := float64(m), float64(n), float64(k)
			elems := 2 * (M*K + K*N) // the host copies, and A and B
			if kind == device.CUDA {
				elems = M*K + K*N
			} else {
				elems += float64(P) * M * (N + K)
			}
			if b := esz * elems * float64(local); b > need {
				need = b
				flags := fmt.Sprintf("--m-max %d, --nk %d", mMax, k)
				if nFixed > 0 {
					flags += fmt.Sprintf(", --n %d", nFixed)
				}
				worst = fmt.Sprintf("%s: the matrices of m=%d n=%d k=%d %s for %d rank(s) of %d here", flags, m, n, k, dt, local, P)
			}
		}
	}
	if need > float64(avail) {
		return usagef("overlap: %s need %.1f GiB of memory at once, and %.1f GiB is available: lower --m-max or --nk", worst, need/(1<<30), float64(avail)/(1<<30))
	}
	return nil
}

// overlapRank runs the overlap sweep on one rank; rank 0 prints.
func overlapRank(ctx context.Context, c *collective.Communicator, mode string, dtypes []string, nks []int, nFixed, mMin, mMax int, piecing overlap.Options, iters int, cpuWindow time.Duration, eager, asCSV, quiet bool, plotFile string) error {
	m, err := resolveMode(mode, c)
	if err != nil {
		return err
	}
	var rs []bench.OverlapResult
	var launches []string // how the gathers ran (overlap.Op.Mode), each once
	start := time.Now()
	for _, dt := range dtypes {
		for _, nk := range nks {
			n := nk
			if nFixed > 0 {
				n = nFixed
			}
			for rows := mMin; rows <= mMax; rows *= 2 {
				var t overlap.Times
				var cut int
				var how string
				switch dt {
				case "float32":
					t, cut, how, err = measureOverlap[float32](ctx, c, rows, n, nk, piecing, iters, cpuWindow)
				case "float64":
					t, cut, how, err = measureOverlap[float64](ctx, c, rows, n, nk, piecing, iters, cpuWindow)
				default:
					err = fmt.Errorf("--dtype %q: want float32 or float64", dt)
				}
				if err != nil {
					return err
				}
				r := bench.OverlapResult{Impl: "slimego", Backend: bench.BackendName(c), Mode: m, P: c.Size(), M: rows, N: n, K: nk, Dtype: dt, Pieces: cut,
					Comm: t.Comm, GEMM: t.GEMM, Seq: t.Seq, Overlap: t.Overlap, Efficiency: t.Efficiency()}
				r.CommCPU, r.GEMMCPU = t.CommCPU, t.GEMMCPU
				rs = append(rs, r)
				if !slices.Contains(launches, how) {
					launches = append(launches, how)
				}
				if !quiet && c.Rank() == 0 {
					busy := ""
					if r.CommCPU > 0 {
						busy = fmt.Sprintf(" (CPU busy %.0f%% gathering, %.0f%% in GEMMs)", 100*r.CommCPU, 100*r.GEMMCPU)
					}
					fmt.Fprintf(os.Stderr, "slimebench: m=%d n=%d k=%d %s: t_comm %.0f µs t_gemm %.0f µs efficiency %.2f%s (%v elapsed)\n",
						rows, n, nk, dt, t.Comm, t.GEMM, r.Efficiency, busy, time.Since(start).Round(time.Millisecond))
				}
				if rows == 0 {
					break
				}
			}
		}
	}
	if c.Rank() != 0 {
		return nil
	}
	title := fmt.Sprintf("slimego allgather+gemm: P=%d nodes=%d backend=%s mode=%s pieces=%d", c.Size(), c.Nodes(), backendLabel(c), m, piecing.Pieces)
	if piecing.MinPieceBytes != 0 {
		title += " min-piece=" + bytesize.Format(int64(max(piecing.MinPieceBytes, 0)))
	}
	if c.Backend() == device.CUDA {
		title += " launch=" + strings.Join(launches, "+")
	}
	// The results first: a plot that cannot be written loses nothing.
	if asCSV {
		if err := bench.WriteOverlapCSV(os.Stdout, rs); err != nil {
			return err
		}
		for _, l := range bench.NoisyRows(rs) {
			fmt.Fprintln(os.Stderr, "# "+l)
		}
	} else {
		tableTitle := title
		if bench.BackendName(c) == bench.EmulatedBackend {
			tableTitle += "\n# " + bench.EmulatedNote // the table's second title line
		}
		bench.WriteOverlapTable(os.Stdout, rs, tableTitle)
	}
	if plotFile != "" {
		if err := bench.PlotOverlap(rs, title, plotFile); err != nil {
			return fmt.Errorf("overlap: --plot %s: %w", plotFile, err)
		}
	}
	return nil
}

func gemmCmd(args []string) error {
	fs := pflag.NewFlagSet("slimebench gemm", pflag.ContinueOnError)
	sizes := fs.IntSlice("size", []int{256, 512, 1024, 2048}, "square sizes m = n = k")
	if err := parseFlags(fs, args, false); err != nil {
		return err
	}
	if len(*sizes) == 0 {
		return usagef("gemm: --size: want at least one size")
	}
	for _, n := range *sizes {
		if n < 1 {
			return usagef("gemm: --size %d: want a positive size", n)
		}
		// a, b and the product, n×n float64 each, at once.
		need := 3 * 8 * float64(n) * float64(n)
		if need >= math.MaxInt64 {
			return usagef("gemm: --size %d: its three float64 matrices need %.0f bytes, more than an int holds", n, need)
		}
		if avail, _, ok := machine.Memory(); ok && int64(need) > avail {
			return usagef("gemm: --size %d: its three float64 matrices need %.1f GiB of memory at once, and %.1f GiB is available", n, need/(1<<30), float64(avail)/(1<<30))
		}
	}
	fmt.Printf("# GEMM GFLOP/s, BLAS %s, GOMAXPROCS %d\n#%7s %10s %10s\n", device.BLAS, runtime.GOMAXPROCS(0), "size", "float32", "float64")
	for _, n := range *sizes {
		fmt.Printf(" %7d %10.2f %10.2f\n", n, gflops[float32](n), gflops[float64](n))
	}
	return nil
}

// gflops times square GEMMs of size n for at least 0.3 s (and 3 runs).
func gflops[T overlap.Float](n int) float64 {
	a, b := make([]T, n*n), make([]T, n*n)
	for i := range a {
		a[i], b[i] = T(float64(i%17)-8), T(float64(i%13)-6)
	}
	overlap.Multiply(a, b, n, n, n) // warm-up
	var runs int
	start := time.Now()
	for runs < 3 || time.Since(start) < 300*time.Millisecond {
		overlap.Multiply(a, b, n, n, n)
		runs++
	}
	return 2 * float64(n) * float64(n) * float64(n) * float64(runs) / time.Since(start).Seconds() / 1e9
}

// backendLabel is the backend a table's title names: "cuda-emu (emulated)"
// where the CUDA library is the emulator, so that no emulated figure reads
// as a GPU's.
func backendLabel(c *collective.Communicator) string {
	if b := bench.BackendName(c); b == bench.EmulatedBackend {
		return b + " (emulated)"
	}
	return c.Backend().String()
}

// resolveBackend reads --backend and says which backend will run. Auto
// never picks the emulated CUDA library (a test harness that SLIME_CUDA_LIB
// may name): only --backend cuda runs on it.
func resolveBackend(name string) (device.Kind, error) {
	kind, err := device.Parse(name)
	if err != nil {
		return kind, err
	}
	if kind == device.Auto && device.CUDAEmulated() {
		return device.CPU, nil
	}
	return device.Resolve(kind)
}

// checkMode refuses a --mode that is none of auto, intra and inter,
// before anything starts; resolveMode checks it against the ranks.
func checkMode(cmd, mode string) error {
	if mode != "auto" && mode != "intra" && mode != "inter" {
		return usagef("%s: --mode %q: want intra, inter or auto", cmd, mode)
	}
	return nil
}

// resolveMode checks --mode against where the ranks run; auto picks intra
// on one node and inter across several.
func resolveMode(mode string, c *collective.Communicator) (string, error) {
	switch mode {
	case "auto":
		return map[bool]string{true: "intra", false: "inter"}[c.Nodes() == 1], nil
	case "intra":
		if c.Nodes() > 1 {
			return "", fmt.Errorf("--mode intra with ranks on %d nodes", c.Nodes())
		}
	case "inter":
		if c.Nodes() == 1 {
			return "", fmt.Errorf("--mode inter needs ranks on more than one node")
		}
	default:
		return "", fmt.Errorf("--mode %q: want intra, inter or auto", mode)
	}
	return mode, nil
}

// measureOverlap times one shape, on the communicator's backend; it
// returns the pieces the gather was cut into too, and how it ran
// (overlap.Op.Mode: graph, eager, staged across nodes, ...).
func measureOverlap[T overlap.Float](ctx context.Context, c *collective.Communicator, m, n, k int, piecing overlap.Options, iters int, cpuWindow time.Duration) (overlap.Times, int, string, error) {
	o, err := overlap.NewWith[T](ctx, c, m, n, k, piecing)
	if err != nil {
		return overlap.Times{}, 0, "", err
	}
	defer o.Close()
	a, b := make([]T, m*k), make([]T, k*n)
	for i := range a {
		a[i] = T(float64((i*7+c.Rank())%13) - 6)
	}
	for i := range b {
		b[i] = T(float64((i*5)%11) - 5)
	}
	if err := o.WriteA(a); err != nil {
		return overlap.Times{}, 0, "", err
	}
	if err := o.WriteB(b); err != nil {
		return overlap.Times{}, 0, "", err
	}
	t, err := overlap.Measure(ctx, c, o, iters)
	if err == nil && cpuWindow > 0 && c.Backend() != device.CUDA {
		t, err = overlap.MeasureCPU(ctx, c, o, t, cpuWindow)
	}
	return t, o.Pieces(), o.Mode(), err
}

func compare(args []string) error {
	fs := pflag.NewFlagSet("slimebench compare", pflag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(os.Stderr, `usage: slimebench compare BASE.csv OTHER.csv ...

Prints the CSV files' rows side by side (BENCHMARKS.md's columns, as
slimebench allgather --csv writes them), the first file's implementation
as the base, with each other's time over the base's. Rows match by P,
size and placement; a row with no match shows '-'. Files of the same
implementation are repeated runs, merged by median.

A row whose median_us is not a positive finite number (NaN, Inf, 0 or
less), or whose algbw or busbw is not a finite number of 0 or more, is
no measurement, nor is a row with wrong bytes: compare refuses the file,
naming it and the line. Rows of
size 0 (nothing is timed) are left out. When no row of any other file
matches a row of the base, compare says so and exits 1.
`)
	}
	if err := parseFlags(fs, args, true); err != nil {
		return err
	}
	if fs.NArg() < 1 {
		return usagef("compare: want CSV files of at least two implementations")
	}
	// Files of the same implementation are repeated runs: merged by median.
	// A file may hold further implementations' rows after its first one's
	// (slimego's ceiling): each of those takes, row by row, the run of the
	// first one's median (MergeAlong), and its column comes after those of
	// the files' first implementations.
	var files [][][]bench.Result
	for _, name := range fs.Args() {
		f, err := os.Open(name)
		if err != nil {
			return err
		}
		data, err := io.ReadAll(f)
		f.Close()
		if err != nil {
			return err
		}
		if data, err = unprefixed(data); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		rs, err := bench.ReadCSV(bytes.NewReader(data))
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if len(rs) == 0 {
			return fmt.Errorf("%s: no rows", name)
		}
		if rs, err = measured(name, rs); err != nil {
			return err
		}
		if len(rs) == 0 {
			return fmt.Errorf("%s: no rows of a size above 0", name)
		}
		files = append(files, bench.ByImpl(rs))
	}
	var order []string
	runs := map[string][][]bench.Result{}
	hosts := map[string][][]bench.Result{} // a further implementation's first ones, run by run
	hostOf := map[string]string{}          // and their name ("" where they differ)
	add := func(impl string, set []bench.Result) {
		if _, ok := runs[impl]; !ok {
			order = append(order, impl)
		}
		runs[impl] = append(runs[impl], set)
	}
	for _, sets := range files {
		add(sets[0][0].Impl, sets[0])
	}
	for _, sets := range files {
		for _, set := range sets[1:] {
			impl, host := set[0].Impl, sets[0][0].Impl
			add(impl, set)
			hosts[impl] = append(hosts[impl], sets[0])
			if h, ok := hostOf[impl]; ok && h != host {
				host = ""
			}
			hostOf[impl] = host
		}
	}
	if len(order) < 2 {
		return fmt.Errorf("compare: every file is %s; want at least two implementations", order[0])
	}
	var sets [][]bench.Result
	for _, impl := range order {
		if hostOf[impl] != "" && len(hosts[impl]) == len(runs[impl]) {
			sets = append(sets, bench.MergeAlong(hosts[impl], runs[impl]))
		} else {
			sets = append(sets, bench.Merge(runs[impl]...))
		}
	}
	// Rows match as bench.Compare matches them (bench.Comparable).
	matched := 0
	for i, set := range sets[1:] {
		n := 0
		for _, b := range sets[0] {
			if slices.ContainsFunc(set, func(o bench.Result) bool { return bench.Comparable(o, b) }) {
				n++
			}
		}
		if n == 0 {
			fmt.Fprintf(os.Stderr, "slimebench compare: no row of %s matches a row of %s (P, size and placement)\n", order[i+1], order[0])
		}
		matched += n
	}
	if matched == 0 {
		return fmt.Errorf("compare: no rows matched: no row of %s has the P, size and placement of a row of %s (P %v, sizes %s … %s)",
			strings.Join(order[1:], ", "), order[0], rowPs(sets[0]), bytesize.Format(sets[0][0].S), bytesize.Format(sets[0][len(sets[0])-1].S))
	}
	fmt.Printf("# %s vs %s: median of %d interleaved run(s) each; ratio = other's time / %s's time (above 1: %s is faster); busbw in GB/s\n",
		order[0], strings.Join(order[1:], ", "), len(runs[order[0]]), order[0], order[0])
	bench.Compare(os.Stdout, sets[0], sets[1:]...)
	return nil
}

// rankPrefix matches slimerun's "[RANK]: " at the start of a worker's
// output line.
var rankPrefix = regexp.MustCompile(`^\[[0-9]+\]: `)

// unprefixed returns a CSV file's bytes without slimerun's rank prefix,
// where its first line has one ('slimerun ... slimebench allgather --csv
// > a.csv' writes rank 0's lines so): every line must then carry the
// same.
func unprefixed(data []byte) ([]byte, error) {
	p := rankPrefix.Find(data)
	if p == nil {
		return data, nil
	}
	lines := bytes.SplitAfter(data, []byte("\n"))
	var out bytes.Buffer
	for i, l := range lines {
		if len(bytes.TrimSpace(l)) == 0 {
			continue
		}
		rest, ok := bytes.CutPrefix(l, p)
		if !ok {
			return nil, fmt.Errorf("csv line %d does not start with %q as the header does (slimerun's rank prefix)", i+1, p)
		}
		out.Write(rest)
	}
	return out.Bytes(), nil
}

// measured checks the rows ReadCSV read from the file name (row i is
// line i+2, after the header): a time that is not a positive finite
// number, or a bandwidth that is not a finite number of 0 or more, is no
// measurement and is refused, naming the file and the line, rather than
// shown as a ratio of NaN or Inf. Rows of size 0, where nothing is timed,
// are left out.
func measured(name string, rs []bench.Result) ([]bench.Result, error) {
	out := rs[:0:0]
	for i, r := range rs {
		line := i + 2
		if r.S == 0 {
			continue
		}
		if math.IsNaN(r.Median) || math.IsInf(r.Median, 0) || r.Median <= 0 {
			return nil, fmt.Errorf("compare: %s line %d: median_us %s: not a measured time (want a positive finite number)", name, line, strconv.FormatFloat(r.Median, 'g', -1, 64))
		}
		if r.Wrong != 0 {
			return nil, fmt.Errorf("compare: %s line %d: %d wrong bytes: the time of a wrong result is no measurement", name, line, r.Wrong)
		}
		for _, bw := range []struct {
			col string
			v   float64
		}{{"algbw_GBps", r.AlgBW}, {"busbw_GBps", r.BusBW}} {
			if math.IsNaN(bw.v) || math.IsInf(bw.v, 0) || bw.v < 0 {
				return nil, fmt.Errorf("compare: %s line %d: %s %s: not a measured bandwidth (want a finite number of 0 or more)", name, line, bw.col, strconv.FormatFloat(bw.v, 'g', -1, 64))
			}
		}
		out = append(out, r)
	}
	return out, nil
}

// rowPs lists the P values of rows, each once.
func rowPs(rs []bench.Result) []int {
	var ps []int
	for _, r := range rs {
		if !slices.Contains(ps, r.P) {
			ps = append(ps, r.P)
		}
	}
	return ps
}

// ranksHere is the job's ranks and those on this node: inProcess of
// each with --in-process, else the launcher's (1 and 1 where it says
// nothing: Init will say what is wrong).
func ranksHere(inProcess int) (P, local int64) {
	if inProcess > 0 {
		return int64(inProcess), int64(inProcess)
	}
	if o, err := collective.LoadEnv(os.Getenv); err == nil {
		return int64(max(o.WorldSize, 1)), int64(max(o.LocalWorldSize, 1))
	}
	return 1, 1
}

// localRanks is the number of ranks the launcher's environment puts on
// this node (1 where it says nothing: Init will say what is wrong).
func localRanks() int64 {
	if o, err := collective.LoadEnv(os.Getenv); err == nil {
		return int64(max(o.LocalWorldSize, 1))
	}
	return 1
}

// btoi is 1 for true, 0 for false.
func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
