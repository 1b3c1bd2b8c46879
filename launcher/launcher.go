// Package launcher starts and supervises the worker processes of a job on
// one node, as torchrun does: it hosts the rendezvous store on node 0, gives
// each worker the torchrun environment (RANK, LOCAL_RANK, WORLD_SIZE,
// LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT), prefixes their
// output with their rank, and when one fails stops the others and reports
// the first failure. cmd/slimerun is its command line.
package launcher

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/slimego/slimego/internal/shm"
	"github.com/slimego/slimego/rendezvous"
)

// Std selects standard streams: a bit set of Stdout and Stderr.
type Std int

const (
	Stdout Std = 1
	Stderr Std = 2
)

// Config is one node's share of a job.
type Config struct {
	NNodes       int
	NProcPerNode int
	NodeRank     int
	MasterAddr   string
	MasterPort   int // 0 with Standalone: a free port
	// Standalone: a single-node job on this host with a store on a free port.
	Standalone bool
	// RunID names the job (store keys, shared-memory names); every node
	// must use the same. Empty: derived from the master port, or random
	// when standalone.
	RunID string
	// JobSecret is what every connection of the job (to the store, between
	// ranks) must prove it holds; every node must be given the same. The
	// workers get it as SLIME_JOB_SECRET. Empty with Standalone: Run makes
	// a random one.
	JobSecret []byte
	// LogDir receives each worker's redirected or teed streams in
	// LogDir/RunID/attempt_N/LOCAL_RANK/{stdout,stderr}.log.
	LogDir string
	// Redirects sends the selected streams of each local rank to its log
	// files only; Tee to the log files and the console. Index: local rank;
	// ranks past the end get neither.
	Redirects, Tee []Std
	// MaxRestarts is how many times a failed group is restarted.
	MaxRestarts int
	// MonitorInterval is how often the launcher checks its workers.
	MonitorInterval time.Duration
	// StopGrace is how long workers get between SIGTERM and SIGKILL.
	StopGrace time.Duration
	// RdzvTimeout bounds the wait for all nodes to join.
	RdzvTimeout time.Duration

	Program string
	Args    []string
	Env     []string  // base environment; os.Environ() when nil
	Stdout  io.Writer // console; os.Stdout when nil
	Stderr  io.Writer // console; os.Stderr when nil
	// Logf reports the launcher's own progress; silent when nil.
	Logf func(format string, args ...any)
}

// WorkerError is the first failure of a job.
type WorkerError struct {
	Rank, LocalRank int
	Attempt         int
	ExitCode        int            // -1 when killed by a signal
	Signal          syscall.Signal // when killed by one
	Pid             int
}

func (e *WorkerError) Error() string {
	how := fmt.Sprintf("exited with code %d", e.ExitCode)
	if e.ExitCode < 0 {
		how = fmt.Sprintf("was killed by signal %d (%v)", int(e.Signal), e.Signal)
	}
	return fmt.Sprintf("rank %d (local rank %d, pid %d) %s", e.Rank, e.LocalRank, e.Pid, how)
}

// ErrInterrupted is returned when the launcher was told to stop.
type ErrInterrupted struct{ Signal os.Signal }

func (e *ErrInterrupted) Error() string { return fmt.Sprintf("interrupted by %v", e.Signal) }

// ErrBadConfig marks configuration errors.
var ErrBadConfig = errors.New("launcher: bad configuration")

func (c *Config) defaults() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrBadConfig}, a...)...)
	}
	if c.Standalone {
		c.NNodes, c.NodeRank = 1, 0
		if c.MasterAddr == "" {
			c.MasterAddr = "127.0.0.1"
		}
	}
	if c.NNodes < 1 {
		return bad("--nnodes %d", c.NNodes)
	}
	if c.NProcPerNode < 1 {
		return bad("--nproc-per-node %d", c.NProcPerNode)
	}
	if c.NodeRank < 0 || c.NodeRank >= c.NNodes {
		return bad("--node-rank %d is not in [0, %d)", c.NodeRank, c.NNodes)
	}
	if c.MasterAddr == "" {
		if c.NNodes > 1 {
			return bad("--master-addr is required with more than one node")
		}
		c.MasterAddr = "127.0.0.1"
	}
	if c.MasterPort == 0 && !c.Standalone {
		c.MasterPort = 29500
	}
	if c.MasterPort < 0 || c.MasterPort > 65535 {
		return bad("--master-port %d", c.MasterPort)
	}
	if c.Program == "" {
		return bad("no program to run")
	}
	if c.MonitorInterval <= 0 {
		c.MonitorInterval = 100 * time.Millisecond
	}
	if c.StopGrace <= 0 {
		c.StopGrace = 5 * time.Second
	}
	if c.RdzvTimeout <= 0 {
		c.RdzvTimeout = 5 * time.Minute
	}
	if c.Env == nil {
		c.Env = os.Environ()
	}
	if c.Stdout == nil {
		c.Stdout = os.Stdout
	}
	if c.Stderr == nil {
		c.Stderr = os.Stderr
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	return nil
}

func (c *Config) auth() rendezvous.Auth {
	return rendezvous.Auth{Secret: c.JobSecret, Job: c.RunID}
}

func stdFor(s []Std, local int) Std {
	if local < len(s) {
		return s[local]
	}
	return 0
}

// Run runs the job's workers on this node until they all exit, one fails,
// or a SIGINT, SIGTERM or SIGHUP arrives (forwarded to every worker). It
// returns nil when every worker exited 0, a *WorkerError naming the first
// failure, or an *ErrInterrupted.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.defaults(); err != nil {
		return err
	}
	if cfg.Program != "" {
		if _, err := exec.LookPath(cfg.Program); err != nil {
			return fmt.Errorf("%w: %v", ErrBadConfig, err)
		}
	}
	if cfg.RunID == "" {
		if cfg.Standalone {
			var b [4]byte
			rand.Read(b[:])
			cfg.RunID = hex.EncodeToString(b[:])
		} else {
			cfg.RunID = "p" + strconv.Itoa(cfg.MasterPort)
		}
	}
	if len(cfg.JobSecret) == 0 && cfg.Standalone {
		var b [32]byte
		rand.Read(b[:])
		cfg.JobSecret = []byte(hex.EncodeToString(b[:]))
	}
	var srv *rendezvous.Server
	if cfg.NodeRank == 0 {
		s, err := rendezvous.Listen(net.JoinHostPort("", strconv.Itoa(cfg.MasterPort)), rendezvous.ServerConfig{Auth: cfg.auth()})
		if err != nil {
			return fmt.Errorf("launcher: cannot host the rendezvous store on port %d: %w", cfg.MasterPort, err)
		}
		defer s.Close()
		srv = s
		cfg.MasterPort = s.Port()
	}
	cfg.Logf("run %s: %d node(s) × %d worker(s), store %s:%d", cfg.RunID, cfg.NNodes, cfg.NProcPerNode, cfg.MasterAddr, cfg.MasterPort)
	if err := joinNodes(ctx, &cfg); err != nil {
		return err
	}
	_ = srv

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	for attempt := 0; ; attempt++ {
		err := runAttempt(ctx, &cfg, attempt, sigs)
		if removed, _ := shm.RemovePrefix(shm.JobPrefix(cfg.RunID)); len(removed) > 0 {
			cfg.Logf("removed %d shared-memory segment(s) the workers left: %v", len(removed), removed)
		}
		var we *WorkerError
		if err == nil || !errors.As(err, &we) || attempt >= cfg.MaxRestarts {
			return err
		}
		cfg.Logf("%v; restarting the workers (%d of %d restarts)", err, attempt+1, cfg.MaxRestarts)
	}
}

// joinNodes waits until every node's launcher has reached the store, so
// that a node that never arrives is reported by rank.
func joinNodes(ctx context.Context, cfg *Config) error {
	if cfg.NNodes == 1 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.RdzvTimeout)
	defer cancel()
	addr := net.JoinHostPort(cfg.MasterAddr, strconv.Itoa(cfg.MasterPort))
	st, err := rendezvous.Dial(ctx, addr, cfg.auth())
	if err != nil {
		return fmt.Errorf("launcher: node %d: %w", cfg.NodeRank, err)
	}
	defer st.Close()
	if err := st.Barrier(ctx, "slimerun/"+cfg.RunID+"/nodes", cfg.NodeRank, cfg.NNodes); err != nil {
		var me *rendezvous.MissingError
		if errors.As(err, &me) {
			return fmt.Errorf("launcher: node %d: node rank(s) %v did not join within %v: %w", cfg.NodeRank, me.Missing, cfg.RdzvTimeout, me.Err)
		}
		return fmt.Errorf("launcher: node %d: %w", cfg.NodeRank, err)
	}
	return nil
}

type worker struct {
	local, rank int
	cmd         *exec.Cmd
	files       []*os.File
	consoles    []*prefixWriter
	exited      bool // set by runAttempt's loop when Wait returned
}

type exit struct {
	w   *worker
	err error
}

func runAttempt(ctx context.Context, cfg *Config, attempt int, sigs <-chan os.Signal) error {
	var consoleMu sync.Mutex
	workers := make([]*worker, cfg.NProcPerNode)
	exits := make(chan exit, cfg.NProcPerNode)
	started := 0
	var startErr error
	for local := range cfg.NProcPerNode {
		w, err := startWorker(cfg, attempt, local, &consoleMu)
		if err != nil {
			startErr = err
			break
		}
		workers[local] = w
		started++
		go func() { exits <- exit{w, w.cmd.Wait()} }()
	}
	var first error
	var failures []error // worker failures before any stop, in report order
	if startErr != nil {
		first = startErr
	}
	running := started
	tick := time.NewTicker(cfg.MonitorInterval)
	defer tick.Stop()
	stopping := false
	var killAt <-chan time.Time
	stop := func(sig syscall.Signal) {
		for _, w := range workers {
			if w != nil && !w.exited {
				syscall.Kill(-w.cmd.Process.Pid, sig)
			}
		}
	}
	startStop := func(sig syscall.Signal) {
		if stopping {
			return
		}
		stopping = true
		stop(sig)
		killAt = time.After(cfg.StopGrace)
	}
	if startErr != nil {
		startStop(syscall.SIGTERM)
	}
	done := ctx.Done()
	for running > 0 {
		select {
		case ex := <-exits:
			running--
			ex.w.exited = true
			for _, p := range ex.w.consoles {
				p.flush()
			}
			for _, f := range ex.w.files {
				f.Close()
			}
			if ex.err != nil && !stopping {
				failures = append(failures, workerError(ex.w, attempt, ex.err))
				if first == nil {
					first = failures[0]
				}
			}
		case <-tick.C:
			if first != nil {
				startStop(syscall.SIGTERM)
			}
		case s := <-sigs:
			if first == nil {
				first = &ErrInterrupted{Signal: s}
			}
			if stopping {
				stop(s.(syscall.Signal))
			} else {
				startStop(s.(syscall.Signal))
			}
		case <-done:
			done = nil
			if first == nil {
				first = &ErrInterrupted{Signal: syscall.SIGTERM}
			}
			startStop(syscall.SIGTERM)
		case <-killAt:
			stop(syscall.SIGKILL)
		}
	}
	if len(failures) > 1 {
		if _, interrupted := first.(*ErrInterrupted); !interrupted {
			first = rootCause(failures)
		}
	}
	return first
}

// rootCause picks, among the failures seen before the launcher stopped
// anyone, the likeliest cause: a worker killed by a signal (which the
// others then noticed and exited over) before one that exited with an
// error, and among equals the first reported. Exits are reported in the
// order their waits return, which a loaded machine can shuffle by a few
// milliseconds, the time the survivors need to notice a lost peer.
func rootCause(failures []error) error {
	for _, f := range failures {
		if we, ok := f.(*WorkerError); ok && we.ExitCode < 0 {
			return f
		}
	}
	return failures[0]
}

func workerError(w *worker, attempt int, err error) error {
	we := &WorkerError{Rank: w.rank, LocalRank: w.local, Attempt: attempt, ExitCode: -1, Pid: w.cmd.Process.Pid}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			we.Signal = ws.Signal()
			return we
		}
		we.ExitCode = ee.ExitCode()
		return we
	}
	return fmt.Errorf("launcher: rank %d: %w", w.rank, err)
}

func startWorker(cfg *Config, attempt, local int, consoleMu *sync.Mutex) (*worker, error) {
	rank := cfg.NodeRank*cfg.NProcPerNode + local
	w := &worker{local: local, rank: rank}
	cmd := exec.Command(cfg.Program, cfg.Args...)
	env := append([]string(nil), cfg.Env...)
	set := func(k, v string) { env = append(env, k+"="+v) }
	itoa := strconv.Itoa
	world := cfg.NNodes * cfg.NProcPerNode
	set("RANK", itoa(rank))
	set("LOCAL_RANK", itoa(local))
	set("WORLD_SIZE", itoa(world))
	set("LOCAL_WORLD_SIZE", itoa(cfg.NProcPerNode))
	set("GROUP_RANK", itoa(cfg.NodeRank))
	set("GROUP_WORLD_SIZE", itoa(cfg.NNodes))
	set("ROLE_RANK", itoa(rank))
	set("ROLE_WORLD_SIZE", itoa(world))
	set("MASTER_ADDR", cfg.MasterAddr)
	set("MASTER_PORT", itoa(cfg.MasterPort))
	set("TORCHELASTIC_RUN_ID", cfg.RunID)
	set("TORCHELASTIC_RESTART_COUNT", itoa(attempt))
	set("TORCHELASTIC_MAX_RESTARTS", itoa(cfg.MaxRestarts))
	set("SLIME_RUN_ID", cfg.RunID)
	set("SLIME_RESTART_COUNT", itoa(attempt))
	set("SLIME_AGENT_STORE", "1")
	if len(cfg.JobSecret) > 0 {
		set("SLIME_JOB_SECRET", string(cfg.JobSecret))
	}
	if _, ok := lookupEnv(cfg.Env, "OMP_NUM_THREADS"); !ok {
		set("OMP_NUM_THREADS", "1")
	}
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 2 * time.Second

	prefix := "[" + itoa(rank) + "]: "
	redir, tee := stdFor(cfg.Redirects, local), stdFor(cfg.Tee, local)
	streams := []struct {
		bit     Std
		name    string
		console io.Writer
		target  *io.Writer
	}{{Stdout, "stdout", cfg.Stdout, &cmd.Stdout}, {Stderr, "stderr", cfg.Stderr, &cmd.Stderr}}
	for _, s := range streams {
		var outs []io.Writer
		if (redir|tee)&s.bit != 0 {
			f, err := openLog(cfg, attempt, local, s.name)
			if err != nil {
				return nil, err
			}
			w.files = append(w.files, f)
			outs = append(outs, f)
		}
		if redir&s.bit == 0 || tee&s.bit != 0 {
			pw := &prefixWriter{mu: consoleMu, out: s.console, prefix: prefix}
			w.consoles = append(w.consoles, pw)
			outs = append(outs, pw)
		}
		*s.target = io.MultiWriter(outs...)
	}
	w.cmd = cmd
	if err := cmd.Start(); err != nil {
		for _, f := range w.files {
			f.Close()
		}
		return nil, fmt.Errorf("launcher: start rank %d: %w", rank, err)
	}
	return w, nil
}

func openLog(cfg *Config, attempt, local int, name string) (*os.File, error) {
	if cfg.LogDir == "" {
		d, err := os.MkdirTemp("", "slimerun-")
		if err != nil {
			return nil, err
		}
		cfg.LogDir = d
		cfg.Logf("logs in %s", d)
	}
	dir := filepath.Join(cfg.LogDir, cfg.RunID, "attempt_"+strconv.Itoa(attempt), strconv.Itoa(local))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("launcher: log dir: %w", err)
	}
	return os.Create(filepath.Join(dir, name+".log"))
}

func lookupEnv(env []string, key string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := cut(env[i]); ok && k == key {
			return v, true
		}
	}
	return "", false
}

func cut(kv string) (string, string, bool) {
	for i := 0; i < len(kv); i++ {
		if kv[i] == '=' {
			return kv[:i], kv[i+1:], true
		}
	}
	return "", "", false
}

// prefixWriter writes whole lines to out, each behind prefix; a partial
// line waits for its end, or for flush once the worker has exited.
type prefixWriter struct {
	mu     *sync.Mutex
	out    io.Writer
	prefix string
	buf    []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.buf = append(p.buf, b...)
	for {
		i := -1
		for j, c := range p.buf {
			if c == '\n' {
				i = j
				break
			}
		}
		if i < 0 {
			break
		}
		p.mu.Lock()
		_, err := io.WriteString(p.out, p.prefix+string(p.buf[:i+1]))
		p.mu.Unlock()
		if err != nil {
			return len(b), nil // a broken console must not stop the worker
		}
		p.buf = p.buf[i+1:]
	}
	if len(p.buf) > 64<<10 { // an endless line: emit what we have
		p.mu.Lock()
		io.WriteString(p.out, p.prefix+string(p.buf)+"\n")
		p.mu.Unlock()
		p.buf = p.buf[:0]
	}
	return len(b), nil
}

func (p *prefixWriter) flush() {
	if len(p.buf) > 0 {
		p.mu.Lock()
		io.WriteString(p.out, p.prefix+string(p.buf)+"\n")
		p.mu.Unlock()
		p.buf = p.buf[:0]
	}
}
