// Command slimerun launches the workers of a slimego job, with torchrun's
// flags and environment:
//
//	slimerun --nproc-per-node 4 ./myprogram --its --own flags
//	slimerun --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500 --nproc-per-node 8 ./train
//
// Workers get RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
// MASTER_ADDR and MASTER_PORT; node 0 hosts the rendezvous store. Output
// lines carry the rank ("[3]: ..."). When a worker fails, the others are
// stopped and slimerun names the first failure (and the rank the workers'
// errors blame) and exits 1; SIGINT, SIGTERM, SIGHUP and SIGQUIT reach every worker
// (SIGHUP not under nohup, which leaves it ignored).
//
// An unmodified torch.distributed program runs under it: slimerun's store
// listens on the rendezvous port (--master-port, or --rdzv-endpoint's
// port) and the workers' MASTER_PORT is another, free port that torch's
// rank 0 binds for torch's own store; slimerun does not speak torch's
// private TCPStore protocol (see package launcher). torchrun's
// --rdzv-backend (static or c10d), --rdzv-endpoint and --rdzv-conf are
// accepted.
//
// Every node of a job across nodes must be given the same secret, in
// SLIME_JOB_SECRET or a file (--job-secret-file, first line, readable by
// its owner only); without one slimerun warns that anyone who can reach
// the store's port can join the job. A standalone job makes its own.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/kernels"
	"github.com/slimego/slimego/launcher"
	"github.com/slimego/slimego/topology"
)

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	fs := pflag.NewFlagSet("slimerun", pflag.ContinueOnError)
	fs.SetInterspersed(false) // everything after the program is the program's
	fs.SetNormalizeFunc(func(_ *pflag.FlagSet, name string) pflag.NormalizedName {
		return pflag.NormalizedName(strings.ReplaceAll(name, "_", "-"))
	})
	var cfg launcher.Config
	nnodes := fs.String("nnodes", "1", "number of nodes (N, or N:N)")
	nproc := fs.String("nproc-per-node", "1", "workers per node: a number, cpu (one per CPU), gpu (one per GPU) or auto (GPUs if any, else CPUs)")
	fs.IntVar(&cfg.NodeRank, "node-rank", 0, "this node's rank")
	fs.StringVar(&cfg.MasterAddr, "master-addr", "127.0.0.1", "address of node 0, which hosts the rendezvous store")
	fs.IntVar(&cfg.MasterPort, "master-port", 29500, "port of the rendezvous store")
	fs.BoolVar(&cfg.Standalone, "standalone", false, "single-node job with its store on a free local port")
	fs.StringVar(&cfg.RunID, "rdzv-id", "", "job id shared by every node (default: derived from the master port)")
	fs.StringVar(&cfg.LogDir, "log-dir", "", "directory for redirected and teed worker output")
	redirects := fs.StringP("redirects", "r", "0", "send worker streams to log files only: 0 none, 1 stdout, 2 stderr, 3 both; or per local rank, 0:1,1:3")
	tee := fs.StringP("tee", "t", "0", "copy worker streams to log files as well as the console (codes as --redirects)")
	ranksFilter := fs.String("local-ranks-filter", "", "only these local ranks' streams reach the console, e.g. 0 or 0,2 (torchrun's); the others' still go to their log files with --redirects or --tee")
	fs.IntVar(&cfg.MaxRestarts, "max-restarts", 0, "restarts of the worker group after a failure")
	// torchrun's --monitor-interval is seconds (0.1); a Go duration works too.
	cfg.MonitorInterval, cfg.StopGrace, cfg.RdzvTimeout = 100*time.Millisecond, 5*time.Second, 5*time.Minute
	fs.Var((*seconds)(&cfg.MonitorInterval), "monitor-interval", "how often workers are checked (seconds, or a duration: 100ms)")
	fs.Var((*seconds)(&cfg.StopGrace), "stop-grace", "time between SIGTERM and SIGKILL when stopping workers (seconds, or a duration)")
	fs.Var((*seconds)(&cfg.RdzvTimeout), "rdzv-timeout", "how long to wait for every node to join (seconds, or a duration)")
	backend := fs.String("rdzv-backend", "static", "torchrun's rendezvous backend: static or c10d (both: node 0's slimerun hosts the store)")
	endpoint := fs.String("rdzv-endpoint", "", "host[:port] of the rendezvous store (as --master-addr and --master-port; port 29400 when left out; port 0, on one node: a free port, as torchrun's)")
	rdzvConf := fs.String("rdzv-conf", "", "torchrun's key=value,... rendezvous settings: timeout (or join_timeout, seconds) sets --rdzv-timeout; the others are ignored")
	secretFile := fs.String("job-secret-file", "", "file whose first line is the job's secret, the same on every node (mode 600); default: SLIME_JOB_SECRET")
	fs.BoolVar(&cfg.Force, "force", false, fmt.Sprintf("run more than %d workers per core", launcher.MaxWorkersPerCore))
	bindTo := fs.String("bind-to", "none", "core: bind local rank i to the i-th CPU this launcher may use, dealt round where workers outnumber CPUs, nodes of the job on one machine with the same CPUs dealing them as one (only where the job has the machine to itself), as mpirun binds; none: leave placement to the scheduler")
	quiet := fs.BoolP("quiet", "q", false, "do not report the launcher's own progress")
	// torchrun runs a Python program itself: a script with python -u,
	// -m a module; --no-python runs the program as it is, which slimerun
	// does for anything but a .py script.
	module := fs.BoolP("module", "m", false, "run the program as a Python module (python3 -u -m MODULE), as torchrun's -m")
	noPython := fs.Bool("no-python", false, "run the program as it is, a .py script too (default: a .py script runs under python3 -u, as torchrun's)")
	runPath := fs.Bool("run-path", false, "run the program as a Python script whatever its name (python3 -u SCRIPT), before --module and --no-python, as torchrun's --run-path")
	fs.StringVar(&cfg.Role, "role", "default", "the workers' ROLE_NAME, as torchrun's")
	startMethod := fs.String("start-method", "spawn", "accepted for torchrun's command lines (spawn, fork or forkserver): it picks how torchrun starts Python functions; slimerun starts programs")
	printTopo := fs.Bool("print-topology", false, "print this machine's CPUs, GPUs (NVML: NVLink, P2P, NUMA) and GPU libraries, then run the program, if any")
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: slimerun [flags] program [args...]\n\n%s", fs.FlagUsages())
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "slimerun:", err)
		return 2
	}
	// As torchrun, a flag the command line leaves out is read from
	// PET_<FLAG> (PET_NNODES, PET_NPROC_PER_NODE, ...), as Kubeflow's
	// PyTorchJob gives them.
	fromEnv := map[string]string{} // flag -> "PET_X=value"
	for _, name := range torchrunEnvFlags {
		env := "PET_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
		v, ok := os.LookupEnv(env)
		if !ok || v == "" || fs.Changed(name) { // torchrun takes an empty one as the default
			continue
		}
		if err := fs.Set(name, v); err != nil {
			fmt.Fprintf(os.Stderr, "slimerun: %s=%q: %v\n", env, v, err)
			return 2
		}
		fromEnv[name] = fmt.Sprintf("%s=%q", env, v)
	}
	fail := func(format string, a ...any) int {
		msg := fmt.Sprintf(format, a...)
		for _, name := range torchrunEnvFlags { // in a fixed order
			if src, ok := fromEnv[name]; ok && strings.Contains(msg, "--"+name) {
				msg += " (from the environment: " + src + ")"
			}
		}
		fmt.Fprintln(os.Stderr, "slimerun: "+msg)
		return 2
	}
	if *printTopo {
		if err := printTopology(os.Stdout); err != nil {
			return fail("%v", err)
		}
		if fs.NArg() == 0 {
			return 0
		}
	}
	// The launcher takes a zero duration for its default: given on the
	// command line, zero or less is a mistake, not a wish for 5 s.
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"stop-grace", cfg.StopGrace}, {"monitor-interval", cfg.MonitorInterval}, {"rdzv-timeout", cfg.RdzvTimeout}} {
		if d.v <= 0 {
			return fail("--%s %v: want a positive duration", d.flag, d.v)
		}
	}
	if cfg.MaxRestarts < 0 {
		return fail("--max-restarts %d: want 0 or more", cfg.MaxRestarts)
	}
	var err error
	if cfg.NNodes, err = parseNodes(*nnodes); err != nil {
		return fail("%v", err)
	}
	if cfg.NProcPerNode, err = parseNProc(*nproc); err != nil {
		return fail("%v", err)
	}
	if cfg.Redirects, err = parseStd(*redirects, cfg.NProcPerNode); err != nil {
		return fail("--redirects: %v", err)
	}
	if cfg.Tee, err = parseStd(*tee, cfg.NProcPerNode); err != nil {
		return fail("--tee: %v", err)
	}
	if fs.Changed("local-ranks-filter") && strings.TrimSpace(*ranksFilter) != "" { // empty: none, as torchrun's
		cfg.ConsoleRanks = []int{}
		for part := range strings.SplitSeq(*ranksFilter, ",") {
			r, err := strconv.Atoi(strings.TrimSpace(part))
			if err != nil || r < 0 || r >= cfg.NProcPerNode {
				return fail("--local-ranks-filter %q: %q is not a local rank of 0 to %d", *ranksFilter, part, cfg.NProcPerNode-1)
			}
			cfg.ConsoleRanks = append(cfg.ConsoleRanks, r)
		}
	}
	switch *bindTo {
	case "none":
	case "core":
		cfg.BindToCore = true
	default:
		return fail("--bind-to %q: want core or none", *bindTo)
	}
	if *backend != "static" && *backend != "c10d" {
		return fail("--rdzv-backend %q: want static or c10d", *backend)
	}
	if *backend == "c10d" && cfg.NNodes > 1 && !fs.Changed("node-rank") {
		// torchrun's c10d hands out node ranks as nodes arrive; here every
		// node would take rank 0, and one on another host than the
		// master's would host a store of its own and wait out the
		// rendezvous timeout.
		return fail("--rdzv-backend c10d --nnodes %d: slimerun does not assign node ranks as torchrun's c10d does: give every node its own --node-rank (0 on the master's host, --rdzv-endpoint's)", cfg.NNodes)
	}
	if *endpoint != "" {
		if cfg.MasterAddr, cfg.MasterPort, err = parseEndpoint(*endpoint); err != nil {
			return fail("%v", err)
		}
	}
	if *rdzvConf != "" {
		t, err := parseRdzvConf(*rdzvConf)
		if err != nil {
			return fail("%v", err)
		}
		if t > 0 && !fs.Changed("rdzv-timeout") {
			cfg.RdzvTimeout = t
		}
	}
	if *secretFile != "" {
		if cfg.JobSecret, err = launcher.ReadSecretFile(*secretFile); err != nil {
			return fail("--job-secret-file: %v", err)
		}
	}
	if _, env := fromEnv["master-port"]; cfg.Standalone && (!fs.Changed("master-port") || env) && *endpoint == "" {
		cfg.MasterPort = 0
	}
	if *endpoint != "" && cfg.MasterPort == 0 && !cfg.Standalone {
		// torchrun's recipe for stacked single-node jobs:
		// --rdzv-endpoint localhost:0 --nnodes 1, a store on a free port.
		if cfg.NNodes != 1 {
			return fail("--rdzv-endpoint %q: port 0 (a free port) is for a job on one node (every node must be given node 0's port)", *endpoint)
		}
		cfg.Standalone = true
	}
	if cfg.MasterPort == 0 && !cfg.Standalone {
		return fail("--master-port 0: a free port is for --standalone (every node must be given node 0's port)")
	}
	if fs.NArg() == 0 {
		if len(args) == 0 {
			fs.Usage()
			return 2
		}
		// Flags but no program: one line, not the whole usage, which
		// hid what was missing under every flag's help.
		return fail("no program to run (usage: slimerun [flags] program [args...]; slimerun --help lists the flags)")
	}
	switch *startMethod {
	case "spawn", "fork", "forkserver":
	default:
		return fail("--start-method %q: want spawn, fork or forkserver", *startMethod)
	}
	cfg.Program, cfg.Args = fs.Arg(0), fs.Args()[1:]
	switch {
	case *runPath: // torchrun's runs the script with runpy.run_path, before -m and --no-python
		cfg.Script = cfg.Program
		cfg.Program, cfg.Args = python(), append([]string{"-u", cfg.Program}, cfg.Args...)
	case *module && *noPython:
		return fail("--module (-m) runs a Python module, --no-python the program as it is: give one")
	case *module:
		cfg.Program, cfg.Args = python(), append([]string{"-u", "-m", cfg.Program}, cfg.Args...)
	case !*noPython && strings.HasSuffix(cfg.Program, ".py"):
		cfg.Script = cfg.Program
		cfg.Program, cfg.Args = python(), append([]string{"-u", cfg.Program}, cfg.Args...)
	}
	if !*quiet {
		cfg.Logf = func(format string, a ...any) { fmt.Fprintf(os.Stderr, "slimerun: "+format+"\n", a...) }
	}
	cfg.Warnf = func(format string, a ...any) { fmt.Fprintf(os.Stderr, "slimerun: WARNING: "+format+"\n", a...) }
	cfg.Stdin = os.Stdin
	err = launcher.Run(context.Background(), cfg)
	var ue *launcher.UnreapedError
	var je *launcher.JobError
	var we *launcher.WorkerError
	var intr *launcher.ErrInterrupted
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue): // before its cause, which it wraps: a worker is left behind
		fmt.Fprintf(os.Stderr, "slimerun: job failed: %v\n", ue)
		return 1
	case errors.As(err, &je):
		fmt.Fprintf(os.Stderr, "slimerun: job failed: %v\n", je)
		return 1
	case errors.As(err, &we):
		fmt.Fprintf(os.Stderr, "slimerun: job failed: first failure: %v\n", we)
		return 1
	case errors.As(err, &intr):
		if err == error(intr) { // from the workers' supervision
			fmt.Fprintf(os.Stderr, "slimerun: %v; workers stopped\n", intr)
		} else { // before any worker started (the rendezvous)
			fmt.Fprintf(os.Stderr, "slimerun: %v\n", err)
		}
		if s, ok := intr.Signal.(syscall.Signal); ok {
			return 128 + int(s)
		}
		return 1
	case errors.Is(err, launcher.ErrBadConfig):
		return fail("%v", err)
	default:
		fmt.Fprintln(os.Stderr, "slimerun:", err)
		return 1
	}
}

// torchrunEnvFlags are the flags torchrun also reads from PET_<FLAG>
// (its env and check_env actions) that slimerun has.
var torchrunEnvFlags = []string{
	"nnodes", "nproc-per-node", "rdzv-backend", "rdzv-endpoint", "rdzv-id", "rdzv-conf", "standalone",
	"max-restarts", "monitor-interval", "start-method", "role", "module", "no-python", "run-path", "log-dir",
	"redirects", "tee", "local-ranks-filter", "node-rank", "master-addr", "master-port",
}

// python is the interpreter of a Python program: PYTHON_EXEC, as
// torchrun reads it, else the python3 on PATH.
func python() string {
	if p := os.Getenv("PYTHON_EXEC"); p != "" {
		return p
	}
	return "python3"
}

// seconds is a duration flag that takes torchrun's number of seconds
// ("0.1", "5") as well as a Go duration ("100ms").
type seconds time.Duration

func (d *seconds) String() string { return time.Duration(*d).String() }

func (d *seconds) Type() string { return "duration" }

func (d *seconds) Set(s string) error {
	if v, err := time.ParseDuration(s); err == nil {
		*d = seconds(v)
		return nil
	}
	f, err := strconv.ParseFloat(s, 64)
	// 2^63 ns and past it do not fit a duration (MaxInt64 as a float64
	// rounds up to 2^63).
	if err != nil || math.IsNaN(f) || math.Abs(f)*float64(time.Second) >= math.MaxInt64 {
		return errors.New(`want seconds ("0.1") or a duration ("100ms", "5m")`)
	}
	*d = seconds(f * float64(time.Second))
	return nil
}

// parseEndpoint reads torchrun's --rdzv-endpoint: host, host:port,
// [v6] or [v6]:port; the port is torchrun's 29400 when left out. Brackets
// hold an IPv6 address and nothing else, and an IPv6 address needs them;
// anything else is refused, even on one node, where the address is not
// used: a typo should not wait to surface on the day a job spans nodes.
func parseEndpoint(s string) (string, int, error) {
	bad := fmt.Errorf("--rdzv-endpoint %q: want host[:port]", s)
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		switch {
		case strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]"):
			host = s[1 : len(s)-1]
		case strings.ContainsAny(s, ":[]"):
			return "", 0, bad
		default:
			host = s
		}
		port = "29400"
	}
	if strings.HasPrefix(s, "[") || strings.Contains(host, ":") {
		if a, err := netip.ParseAddr(host); err != nil || !a.Is6() {
			return "", 0, bad
		}
	}
	p, perr := strconv.Atoi(port)
	// Port 0 is torchrun's free port, for a job on one node (run checks).
	if host == "" || strings.ContainsAny(host, "[]/ ") || perr != nil || p < 0 || p > 65535 {
		return "", 0, bad
	}
	return host, p, nil
}

// rdzvConfKeys are the --rdzv-conf keys torchrun's backends know; slimerun
// takes timeout (and join_timeout) as --rdzv-timeout and ignores the rest.
var rdzvConfKeys = map[string]bool{
	"timeout": true, "join_timeout": true, "read_timeout": true, "last_call_timeout": true,
	"close_timeout": true, "heartbeat": true, "keep_alive_interval": true, "keep_alive_max_attempt": true,
	"is_host": true, "store_type": true, "use_libuv": true, "rank": true,
}

// parseRdzvConf reads --rdzv-conf "k=v,k=v" and returns its timeout (0
// when it gives none).
func parseRdzvConf(s string) (time.Duration, error) {
	var timeout time.Duration
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		k, v, ok := strings.Cut(part, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" {
			return 0, fmt.Errorf("--rdzv-conf %q: %q is not key=value", s, part)
		}
		if !rdzvConfKeys[k] {
			return 0, fmt.Errorf("--rdzv-conf %q: unknown key %q", s, k)
		}
		if k == "timeout" || k == "join_timeout" {
			// Seconds as --rdzv-timeout takes them (seconds.Set refuses
			// what no duration holds); and at least a nanosecond, since
			// 0 would mean "the default".
			var d seconds
			if err := d.Set(v); err != nil || d <= 0 {
				return 0, fmt.Errorf("--rdzv-conf %s=%q: want a positive number of seconds", k, v)
			}
			timeout = time.Duration(d)
		}
	}
	return timeout, nil
}

func parseNodes(s string) (int, error) {
	lo, hi, ranged := strings.Cut(s, ":")
	n, err := strconv.Atoi(lo)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("--nnodes %q: want a positive number", s)
	}
	if ranged {
		m, err := strconv.Atoi(hi)
		if err != nil || m != n {
			return 0, fmt.Errorf("--nnodes %q: elastic ranges are not supported; give MIN:MAX with MIN = MAX", s)
		}
	}
	return n, nil
}

// parseNProc reads --nproc-per-node as torchrun does: a number; cpu, one
// per CPU; gpu, one per GPU (an error without one); auto, one per GPU
// where there are any, else one per CPU.
func parseNProc(s string) (int, error) {
	switch s {
	case "cpu":
		return runtime.NumCPU(), nil
	case "gpu":
		n, err := countGPUs()
		if err != nil {
			return 0, fmt.Errorf("--nproc-per-node gpu: %v", err)
		}
		return n, nil
	case "auto":
		if n, err := countGPUs(); err == nil && n > 0 {
			return n, nil
		}
		return runtime.NumCPU(), nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("--nproc-per-node %q: want a positive number, cpu, gpu or auto", s)
	}
	if n > launcher.MaxWorkers {
		// Refused here, before --redirects and --tee make a table of n.
		return 0, fmt.Errorf("--nproc-per-node %d: a job runs at most %d workers", n, launcher.MaxWorkers)
	}
	return n, nil
}

// countGPUs is how many GPUs the workers' CUDA will show them: the CUDA
// backend's count where slimego's CUDA library loads, else NVML's as
// CUDA_VISIBLE_DEVICES narrows it (a PyTorch program needs no library of
// slimego's, and torchrun counts GPUs with torch's CUDA).
func countGPUs() (int, error) {
	n, err := device.CUDADeviceCount()
	if err == nil {
		return n, nil
	}
	m, nerr := topology.VisibleGPUs()
	if nerr != nil {
		return 0, fmt.Errorf("no GPU found: CUDA backend: %v; NVML: %v", err, nerr)
	}
	return m, nil
}

// parseStd reads torchrun's stream codes: "3" for every local rank, or
// "0:1,1:2" per local rank.
func parseStd(s string, nproc int) ([]launcher.Std, error) {
	code := func(v string) (launcher.Std, error) {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 0 || n > 3 {
			return 0, fmt.Errorf("%q is not 0, 1, 2 or 3", v)
		}
		return launcher.Std(n), nil
	}
	if !strings.Contains(s, ":") {
		c, err := code(s)
		if err != nil || c == 0 {
			return nil, err
		}
		out := make([]launcher.Std, nproc)
		for i := range out {
			out[i] = c
		}
		return out, nil
	}
	var out []launcher.Std
	for part := range strings.SplitSeq(s, ",") {
		k, v, _ := strings.Cut(part, ":")
		i, err := strconv.Atoi(strings.TrimSpace(k))
		if err != nil || i < 0 {
			return nil, fmt.Errorf("%q: bad local rank", part)
		}
		c, err := code(v)
		if err != nil {
			return nil, err
		}
		if i >= nproc {
			continue // a local rank this node does not run: torchrun ignores it too
		}
		for len(out) <= i {
			out = append(out, 0)
		}
		out[i] = c
	}
	return out, nil
}

// printTopology shows what the CUDA backend would find here.
func printTopology(w io.Writer) error {
	t, err := topology.Read()
	if err != nil {
		return err
	}
	t.Write(w)
	if lib, err := kernels.Open(); err != nil {
		fmt.Fprintf(w, "CUDA backend: unavailable (%v)\n", err)
	} else if n, err := device.CUDADeviceCount(); err != nil {
		fmt.Fprintf(w, "CUDA backend: %s loaded; %v\n", lib.Path(), err)
	} else {
		drv, rt, _ := lib.Versions()
		fmt.Fprintf(w, "CUDA backend: %s, %d device(s), driver %d.%d, runtime %d.%d\n", lib.Path(), n, drv/1000, drv%1000/10, rt/1000, rt%1000/10)
	}
	if nv, err := kernels.OpenNVSHMEM(); err != nil {
		fmt.Fprintf(w, "NVSHMEM: unavailable, GPU data crosses nodes through host memory and TCP (%v)\n", err)
	} else {
		fmt.Fprintf(w, "NVSHMEM: %s\n", nv.Path())
	}
	return nil
}
