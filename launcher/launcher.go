// Package launcher starts and supervises the worker processes of a job on
// one node, as torchrun does: it hosts the rendezvous store on node 0, gives
// each worker the torchrun environment (RANK, LOCAL_RANK, WORLD_SIZE,
// LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT), prefixes their
// output with their rank, and when one fails stops the others and reports
// the first failure. cmd/slimerun is its command line.
//
// MASTER_PORT is left free for the workers' own use. An unmodified
// torch.distributed program (init_method="env://") has its rank 0 bind
// MASTER_PORT for torch's TCPStore; rather than speak torch's private
// TCPStore protocol, the launcher's store listens on the rendezvous port
// (Config.MasterPort: slimerun's --master-port or --rdzv-endpoint's port)
// and node 0 picks a free port for MASTER_PORT (it binds port 0 on the
// store's address, reads the port and closes, as torchrun's c10d backend
// does) and publishes it in the store for the other nodes, a new one for
// each restart across nodes (startTogether). Workers learn
// the launcher's store from SLIME_STORE_PORT (host: MASTER_ADDR) with
// SLIME_AGENT_STORE=1, and TORCHELASTIC_USE_AGENT_STORE=False tells torch
// to host its own store on MASTER_PORT.
//
// The store is bound to loopback for a job on one node, and across nodes to
// the one address that reaches the master, never to every interface; every
// connection proves the job's secret (Config.JobSecret). When a worker
// exits, the launcher aborts the attempt's store keys
// (rendezvous.AttemptPrefix) so that the ranks still waiting on it fail at
// once, naming it, instead of after their whole timeout.
//
// Each worker leads a process group of its own, which its children join.
// Signals go to the groups, and no process of the job outlives it: once
// the workers have exited, what is left in their groups (a child that
// ignores SIGTERM, a script's background job) gets SIGKILL when the
// --stop-grace after the first SIGTERM ends, and after a success it is
// stopped the same way, with a warning. A process that leaves the group
// (setsid) is not the launcher's to stop. The launcher reaps a worker
// only after its group is dealt with, so that a group id it signals is
// never a stranger's (see group_linux.go).
package launcher

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/slimego/slimego/internal/auth"
	"github.com/slimego/slimego/internal/machine"
	"github.com/slimego/slimego/internal/netaddr"
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
	// MasterAddr is node 0's address: where the other nodes reach its
	// store, and the workers' MASTER_ADDR across nodes (a job on one node
	// gives its workers 127.0.0.1).
	MasterAddr string
	// MasterPort is the port of the launcher's store (the rendezvous
	// port); 0 with Standalone: a free port. The workers' MASTER_PORT is
	// another port, free for torch's own store (see the package doc).
	MasterPort int
	// Standalone: a single-node job on this host with a store on a free
	// port; NNodes above 1 or a NodeRank other than 0 is refused.
	Standalone bool
	// RunID names the job (store keys, shared-memory names); every node
	// must use the same. Empty: derived from the master port, or random
	// when standalone.
	RunID string
	// Role is the workers' ROLE_NAME, as torchrun's --role; empty:
	// "default".
	Role string
	// JobSecret is what every connection of the job (to the store, between
	// ranks) must prove it holds; every node must be given the same. The
	// workers get it as SLIME_JOB_SECRET. Empty: read from Env's
	// SLIME_JOB_SECRET, or the file SLIME_JOB_SECRET_FILE names (see
	// ReadSecretFile); still empty on one node: Run makes a random one;
	// across nodes the job runs without, and Warnf says what that risks.
	JobSecret []byte
	// Force runs more than MaxWorkersPerCore workers per core.
	Force bool
	// BindToCore binds local rank i to the i-th CPU the launcher may run
	// on, as mpirun binds two ranks by default and srun --cpu-bind=cores
	// does: ranks that wait by polling then never share a core, which the
	// scheduler otherwise does when a wake-up pulls one rank onto the
	// other's core. With more ranks than CPUs the CPUs are dealt round
	// (rank i on CPU i mod n, as mpirun's --map-by core with
	// --bind-to core:overload-allowed), so that every CPU carries its
	// share: unbound, the scheduler leaves three ranks on one core and
	// one on the other for long stretches, and a call then waits for the
	// crowded core. Nodes of the job that share one machine (namespaces,
	// containers: the same boot id) and the same CPUs deal them as one
	// node: a node's rank 0 comes after the earlier nodes' ranks. Only
	// for a machine that runs this job alone: two jobs bound alike would
	// put their ranks on the same cores.
	BindToCore bool
	// LogDir receives each worker's redirected or teed streams in
	// LogDir/RunID/attempt_N/LOCAL_RANK/{stdout,stderr}.log; across nodes
	// in LogDir/RunID/node_NODE_RANK/attempt_N/LOCAL_RANK/, so that nodes
	// that share it keep their own.
	LogDir string
	// Redirects sends the selected streams of each local rank to its log
	// files only; Tee to the log files and the console. Index: local rank;
	// ranks past the end get neither.
	Redirects, Tee []Std
	// ConsoleRanks, when not nil, are the local ranks whose streams reach
	// the console (torchrun's --local-ranks-filter); the others' go to
	// their log files only, if redirected or teed, else nowhere.
	ConsoleRanks []int
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
	// Script, if set, is a file Program runs (a Python script): where it
	// is missing, the program is, as where Program is not found.
	Script string
	Env    []string // base environment; os.Environ() when nil
	// Stdin is every worker's standard input, as torchrun's workers
	// inherit its own (slimerun gives os.Stdin); nil: /dev/null.
	Stdin  *os.File
	Stdout io.Writer // console; os.Stdout when nil
	Stderr io.Writer // console; os.Stderr when nil
	// Logf reports the launcher's own progress; silent when nil.
	Logf func(format string, args ...any)
	// Warnf reports what the user must see even when Logf is silent;
	// "launcher: WARNING: ..." on Stderr when nil.
	Warnf func(format string, args ...any)

	cpus []int // BindToCore: the CPUs local ranks are dealt, in order
}

// Workers per core (runtime.NumCPU) beyond which Run warns, and beyond
// which it refuses without Config.Force: a thousand workers fork until the
// machine runs out of memory.
const (
	WarnWorkersPerCore = 4
	MaxWorkersPerCore  = 64
)

// MaxWorkers bounds a job's workers, every node's together, and so its
// nodes: the store's barriers (the launchers' of the nodes, a
// communicator's of its ranks) have at most rendezvous.MaxCallKeys
// members.
const MaxWorkers = rendezvous.MaxCallKeys

// numCPU is runtime.NumCPU; tests replace it.
var numCPU = runtime.NumCPU

// PortKey is the store key under which node 0's launcher publishes the
// workers' MASTER_PORT for the other nodes.
func PortKey(runID string) string { return "slimerun/" + runID + "/master_port" }

// BlameKey is the store key under which a worker of an attempt records the
// rank it blames for its failure (the decimal rank).
func BlameKey(runID string, attempt, rank int) string {
	return rendezvous.AttemptPrefix(runID, attempt) + "blame/" + strconv.Itoa(rank)
}

// WorkerError is the first failure of a job.
type WorkerError struct {
	Rank, LocalRank int
	Attempt         int
	ExitCode        int            // -1 when killed by a signal
	Signal          syscall.Signal // when killed by one
	Pid             int
	// Message is what the worker wrote to its error file
	// (TORCHELASTIC_ERROR_FILE; torch's @record writes the exception
	// that ended it), "" where it wrote none (errorfile.go).
	Message string
}

func (e *WorkerError) Error() string {
	s := fmt.Sprintf("rank %d (local rank %d, pid %d) %s", e.Rank, e.LocalRank, e.Pid, e.how())
	if e.Message != "" {
		first, _, more := strings.Cut(e.Message, "\n")
		s += ": " + first
		if more {
			s += " …"
		}
	}
	return s
}

func (e *WorkerError) how() string {
	if e.ExitCode < 0 {
		return fmt.Sprintf("was killed by signal %d (%v)", int(e.Signal), e.Signal)
	}
	return fmt.Sprintf("exited with code %d", e.ExitCode)
}

// JobError is what Run returns when workers failed: the likeliest first
// failure (a *WorkerError, which errors.As finds through it), every
// failure this node saw before it stopped the rest, and the rank that the
// workers' own errors blame (BlameKey), when most of them name one: after
// a stalled rank makes its peers time out, the first failure is a
// survivor, and Blamed is the stalled rank.
type JobError struct {
	First    *WorkerError
	Failures []*WorkerError
	// Blamed is the rank most failed workers blame; -1 when none.
	Blamed int
	// Summary says what became of Blamed and of the failed workers:
	// "rank 3 did not exit; ranks 0,1,2 exited with code 1".
	Summary string
}

func (e *JobError) Error() string {
	if e.Blamed < 0 {
		return "first failure: " + e.First.Error()
	}
	return fmt.Sprintf("rank %d is the one the others' errors name (%s); first failure: %v", e.Blamed, e.Summary, e.First)
}

func (e *JobError) Unwrap() error { return e.First }

// RemoteError is what Run returns on a node whose workers it stopped
// because a worker of another node failed first: the rank that failed and
// what its launcher said of it.
type RemoteError struct {
	Rank, Node int // Node is -1 where the rank is not the job's
	Attempt    int
	Reason     string
	// Interrupted: node Node's launcher was told to stop (a signal), not
	// failed; the job ends everywhere, with no restart.
	Interrupted bool
	// NotStarted: node Node's launcher could not start rank Rank (its
	// program, its interpreter or its log file is missing there, or the
	// system refused a process); the job ends everywhere, with no
	// restart, as it does on that node: another attempt would wait for
	// workers that node does not start.
	NotStarted bool
	// Lost: node Node's launcher died (its guard said so; for node 0,
	// its store went away before node 0 said it ended); the job ends
	// everywhere, with no restart: another attempt would wait for
	// workers that node no longer runs.
	Lost bool
}

func (e *RemoteError) Error() string {
	// The reason came from the store: no control characters (a
	// terminal's escape sequences) reach this node's terminal.
	why := printable(e.Reason, 512)
	switch {
	case e.Node < 0: // a rank outside the job: a member's abort, not a launcher's
		return fmt.Sprintf("rank %d was reported failed: %s; this node's workers were stopped", e.Rank, why)
	case e.Interrupted, e.Lost:
		return fmt.Sprintf("%s; this node's workers were stopped", why)
	case e.NotStarted:
		return fmt.Sprintf("node %d could not start its workers: %s; this node's workers were stopped", e.Node, why)
	}
	return fmt.Sprintf("a worker of node %d failed: %s; this node's workers were stopped", e.Node, why)
}

// interruptedReason is the reason a node's launcher gives the others when
// a signal stops it; isInterrupted recognizes it, from node's first rank
// (an abort of another rank, or any other reason, is a failure).
func interruptedReason(node int, s os.Signal) string {
	return fmt.Sprintf("node %d was interrupted by %v", node, s)
}

// cancelledReason is interruptedReason for a Run whose context was
// cancelled (the launcher used as a library, stopped by its caller).
func cancelledReason(node int) string {
	return fmt.Sprintf("node %d was interrupted by its launcher's caller (Run's context was cancelled)", node)
}

func isInterrupted(node int, reason string) bool {
	return node >= 0 && strings.HasPrefix(reason, fmt.Sprintf("node %d was interrupted by ", node))
}

// lostReason is the reason a node's guard gives the others when its
// launcher (pid) died before the job ended there (guard_linux.go);
// isLost recognizes it, and storeLostReason, from node's first rank.
func lostReason(node, pid int) string {
	return fmt.Sprintf("node %d's launcher (pid %d) died before the job ended there; its guard stopped what its workers left", node, pid)
}

func isLost(node int, reason string) bool {
	return node >= 0 && strings.HasPrefix(reason, fmt.Sprintf("node %d's launcher ", node)) && strings.Contains(reason, " died")
}

// storeLostReason is the reason a node gives itself when node 0's store
// is lost before node 0 said it ended (endKey): node 0's launcher, which
// serves it, died, or its host did.
func storeLostReason(addr string, attempt int, err error) string {
	return fmt.Sprintf("node 0's launcher died, or its host did: its store at %s was lost in attempt %d before node 0 said it ended (%v)", addr, attempt, err)
}

// endKey is the key that node 0's launcher sets when its last attempt's
// workers have all exited 0: the other nodes' launchers, who wait on it
// for the whole run (watchEnd), then know that losing the store
// afterwards is node 0's end, not its death. It lies outside the prefixes
// that launchers abort.
func endKey(runID string) string { return "slimerun-end/" + runID }

// startError is the error, and the reason given the other nodes, of a
// worker that could not be started; isStartFailure recognizes that reason
// for rank.
func startError(rank int, err error) error {
	return fmt.Errorf("launcher: start rank %d: %w", rank, err)
}

func isStartFailure(rank int, reason string) bool {
	return rank >= 0 && strings.HasPrefix(reason, fmt.Sprintf("launcher: start rank %d: ", rank))
}

// failedPrefix is the store prefix that a node aborts, with the rank and
// the reason, when one of its workers fails in an attempt: every node's
// launcher waits on it (watchFailures), and stops its own workers when
// another node's worker failed.
// It lies outside nodesPrefix, which a launcher that gives up the
// rendezvous aborts (a stray one too): that must not read as a failure.
func failedPrefix(runID string, attempt int) string {
	return "slimerun-failed/" + runID + "/" + strconv.Itoa(attempt) + "/"
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
		// As torchrun's --standalone: one node. Another count (or node
		// rank) would otherwise be dropped without a word.
		if c.NNodes > 1 || c.NodeRank != 0 {
			return bad("--standalone runs one node; --nnodes %d --node-rank %d contradict it (leave them out, or leave --standalone out and give every node --master-addr)", c.NNodes, c.NodeRank)
		}
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
	if c.NNodes > MaxWorkers {
		return bad("--nnodes %d: a job runs at most %d nodes (the store's barrier waits for at most %d members)", c.NNodes, MaxWorkers, MaxWorkers)
	}
	if c.NProcPerNode > MaxWorkers || c.NNodes*c.NProcPerNode > MaxWorkers {
		return bad("--nnodes %d × --nproc-per-node %d workers: a job runs at most %d workers (the store's barrier waits for at most %d members)", c.NNodes, c.NProcPerNode, MaxWorkers, MaxWorkers)
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
	if c.RunID != "" && !validRunID(c.RunID) {
		return bad("--rdzv-id %q: want at most %d letters, digits, '.', '_' or '-', without \"..\" (it names the job's shared memory and log directory)", c.RunID, maxRunID)
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
	if c.LogDir != "" {
		// Absolute, as torchrun's: a worker that changes its directory
		// (hydra's runs do) must still write its TORCHELASTIC_ERROR_FILE
		// where the launcher reads it.
		d, err := filepath.Abs(c.LogDir)
		if err != nil {
			return bad("--log-dir %q: %v", c.LogDir, err)
		}
		c.LogDir = d
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
	if c.Warnf == nil {
		stderr := c.Stderr
		c.Warnf = func(format string, a ...any) { fmt.Fprintf(stderr, "launcher: WARNING: "+format+"\n", a...) }
	}
	cores := numCPU()
	if n := c.NProcPerNode; n > MaxWorkersPerCore*cores && !c.Force {
		return bad("--nproc-per-node %d is more than %d workers per core on this machine's %d core(s): that many processes can exhaust its memory; --force runs them anyway", n, MaxWorkersPerCore, cores)
	} else if n > WarnWorkersPerCore*cores {
		c.Warnf("%d workers on %d core(s) (over %d per core): they will compete for the CPUs and memory", n, cores, WarnWorkersPerCore)
	}
	if c.BindToCore {
		cpus, err := allowedCPUs()
		if err != nil {
			return bad("--bind-to core: reading this process's CPUs: %v", err)
		}
		if len(cpus) == 0 {
			return bad("--bind-to core: this process may run on no CPU it can name")
		}
		c.cpus = cpus
	}
	if len(c.JobSecret) == 0 {
		if v, ok := lookupEnv(c.Env, "SLIME_JOB_SECRET"); ok && v != "" {
			c.JobSecret = []byte(v)
		} else if f, ok := lookupEnv(c.Env, "SLIME_JOB_SECRET_FILE"); ok && strings.TrimSpace(f) != "" {
			b, err := ReadSecretFile(strings.TrimSpace(f))
			if err != nil {
				return fmt.Errorf("%w (SLIME_JOB_SECRET_FILE)", err)
			}
			c.JobSecret = b
		}
	}
	return nil
}

// maxRunID bounds a run id: the shared-memory names it starts (with the
// attempt, the creator's pid and start time and a nonce) stay within
// shm.MaxName.
const maxRunID = 128

// validRunID says whether id can name the job's shared memory
// (shm.CheckName) and log directory: a plain name, never a path.
func validRunID(id string) bool {
	return len(id) <= maxRunID && shm.CheckName(shm.JobPrefix(id), shm.Prefix) == nil
}

// ReadSecretFile reads a job secret from the first line of path (trimmed;
// it must not be empty). Like ssh with a private key, it refuses a file
// of another user's, or that its group or others may read or write: the
// secret is what keeps strangers out of the job.
func ReadSecretFile(path string) ([]byte, error) {
	b, err := auth.ReadSecretFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadConfig, err)
	}
	return b, nil
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

// job is one node's running share of a job: the store it hosts (node 0)
// or its connection to node 0's (the others), and what the workers are
// told.
type job struct {
	// refused counts the connections node 0's store refused (another
	// job's secret or run id): said when a node does not join.
	refused atomic.Int64
	// outGone and errGone say, once each, that a console stream failed.
	outGone, errGone sync.Once
	cfg              *Config
	// bindHost is the address the store (and the MASTER_PORT probe) bind:
	// loopback on one node, else the one that reaches the master.
	bindHost string
	// workerAddr and torchPort are the workers' MASTER_ADDR and MASTER_PORT.
	workerAddr string
	torchPort  int
	srv        *rendezvous.Server // node 0
	// noProgram is why Program cannot be run on this node, across nodes:
	// the node claims its rank and then calls the rendezvous off with it
	// (joinNodes), so that the other nodes fail at once naming it, not
	// at their rendezvous timeout.
	noProgram error
	client    *rendezvous.Client // the other nodes: aborts and blame reads
	aborts    sync.WaitGroup
	// lastAbort is closed when the latest abort sent through client has
	// returned (nil: none yet); the next one waits for it (abort).
	lastAbort chan struct{}
	// cpuBase is where this node's local rank 0 starts in cfg.cpus: the
	// ranks of earlier nodes bound to the same CPUs (see placement.go).
	cpuBase int
	// storeAddr is where this node reaches the store (across nodes).
	storeAddr string
	// node0Ended: node 0 said it ended (endKey; watchEnd, reach).
	node0Ended atomic.Bool
	// watch is the connection the first attempt's watchFailures waits
	// on, made during the rendezvous while node 0 surely serves (a node
	// 0 whose workers failed at once may have stopped taking connections
	// by the time this node's workers have started); nil once taken.
	watch *rendezvous.Client
	// guard cleans up after the workers' process groups if the launcher
	// dies (guard_linux.go); nil if none could start.
	guard *guard
	// errDir holds the workers' error files where no log directory was
	// given (errorfile.go); Run removes it.
	errDir string
}

// Run runs the job's workers on this node until they all exit, one fails,
// or a SIGINT, SIGTERM, SIGHUP or SIGQUIT arrives (forwarded to every worker;
// SIGHUP not where the process started with it ignored, under nohup). It
// returns nil when every worker exited 0, a *JobError naming the first
// failure (and the rank the workers blame), a *RemoteError when a worker
// of another node failed first (this node's workers are then stopped as
// when one of its own fails), or an *ErrInterrupted. Cancelling ctx stops
// the workers as a SIGTERM would, and across nodes tells the others that
// this node was interrupted (they stop theirs and do not restart). A
// panic in Run is no clean end: the guard stops what is left and tells
// the other nodes, as if the launcher had been killed.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.defaults(); err != nil {
		return err
	}
	var noProgram error
	if cfg.Program != "" {
		// A program found through "." in PATH runs, as the shell and
		// torchrun run it (see startWorker).
		if _, err := exec.LookPath(cfg.Program); err != nil && !errors.Is(err, exec.ErrDot) {
			noProgram = fmt.Errorf("%w: %v", ErrBadConfig, err)
		} else if cfg.Script != "" {
			if _, err := os.Stat(cfg.Script); err != nil {
				noProgram = fmt.Errorf("%w: the program's script: %v", ErrBadConfig, err)
			}
		}
		if noProgram != nil && cfg.NNodes == 1 {
			return noProgram
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
	if cfg.LogDir != "" {
		// The same command again (across nodes the run id defaults to
		// the port): its logs go where the earlier run's are.
		if d := cfg.logRoot(cfg.LogDir); dirExists(d) {
			cfg.Warnf("the log directory %s holds an earlier run's logs (run id %q): this run's replace them where they meet; give each run its own --rdzv-id or --log-dir to keep both", d, cfg.RunID)
		}
	}
	if len(cfg.JobSecret) == 0 {
		if cfg.NNodes == 1 {
			var b [32]byte
			rand.Read(b[:])
			cfg.JobSecret = []byte(hex.EncodeToString(b[:]))
		} else {
			cfg.Warnf("no job secret (SLIME_JOB_SECRET or --job-secret-file) for a job across %d nodes: anyone who can reach the store at %s:%d can join the job, read its data and redirect its connections; give every node the same secret", cfg.NNodes, cfg.MasterAddr, cfg.MasterPort)
		}
	}
	// From here on a signal is the job's to handle (it calls off the
	// rendezvous, or stops the workers), not a silent end of the launcher.
	sigs := make(chan os.Signal, 4)
	stopSigs := []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT}
	if !hupIgnored {
		stopSigs = append(stopSigs, syscall.SIGHUP)
	}
	signal.Notify(sigs, stopSigs...)
	defer signal.Stop(sigs)
	// A console that goes away (slimerun ... | head) must not end the
	// launcher: without a Notify for SIGPIPE the runtime dies of it on a
	// write to stdout or stderr; with one, that write fails with EPIPE,
	// which the workers' output copies drop. (Ignoring SIGPIPE instead
	// would pass the ignoring on to the workers.) Nothing reads pipe.
	pipe := make(chan os.Signal, 1)
	signal.Notify(pipe, syscall.SIGPIPE)
	defer signal.Stop(pipe)
	sweepOrphans(&cfg)
	g, err := startGuard(cfg.Stderr)
	if err != nil {
		cfg.Logf("no guard process (what the workers leave is not cleaned up if slimerun is killed): %v", err)
	}
	defer func() {
		// A panic is no clean end: the guard stops what the workers
		// left and tells the other nodes, as if the launcher were killed.
		if r := recover(); r != nil {
			g.abandon()
			panic(r)
		}
		g.close()
	}()
	j := &job{cfg: &cfg, bindHost: "127.0.0.1", workerAddr: "127.0.0.1", guard: g, noProgram: noProgram}
	defer func() {
		if j.errDir != "" {
			os.RemoveAll(j.errDir)
		}
	}()
	if cfg.NNodes > 1 {
		j.workerAddr = cfg.MasterAddr
		if cfg.NodeRank == 0 {
			ifname, _ := lookupEnv(cfg.Env, "SLIME_SOCKET_IFNAME")
			h, err := netaddr.ListenIP(strings.TrimSpace(ifname), cfg.MasterAddr, true)
			if err != nil {
				return fmt.Errorf("launcher: node 0: the address that reaches the master %s: %w", cfg.MasterAddr, err)
			}
			j.bindHost = h
		}
	}
	if cfg.NodeRank == 0 {
		s, err := rendezvous.Listen(net.JoinHostPort(j.bindHost, strconv.Itoa(cfg.MasterPort)), rendezvous.ServerConfig{Auth: cfg.auth(), OnRefused: j.countRefused(refusedWarning(cfg.Warnf))})
		if err != nil {
			return fmt.Errorf("launcher: cannot host the rendezvous store on %s port %d: %w", j.bindHost, cfg.MasterPort, err)
		}
		// Across nodes the others' launchers and workers may still be
		// using the store when this node's workers are done: it serves
		// them until they hang up, for a while.
		defer s.Shutdown(storeGrace(&cfg))
		// While it serves them, a signal ends the launcher as it would
		// have without one (Stop runs before Shutdown; again at the end).
		defer signal.Stop(sigs)
		j.srv = s
		cfg.MasterPort = s.Port()
		if j.torchPort, err = freePort(j.bindHost); err != nil {
			return err
		}
	}
	cfg.Logf("run %s: %d node(s) × %d worker(s), store %s:%d", cfg.RunID, cfg.NNodes, cfg.NProcPerNode, cfg.MasterAddr, cfg.MasterPort)
	defer func() { // before node 0's store shuts down: it waits for its clients
		if j.watch != nil { // dialed by joinNodes, not taken by an attempt
			j.watch.Close()
		}
	}()
	if noProgram != nil {
		// Said now: the rendezvous that tells the other nodes may wait
		// for node 0's store up to RdzvTimeout.
		cfg.Logf("node %d: %v; calling the rendezvous off", cfg.NodeRank, noProgram)
	}
	if err := j.joinInterruptible(ctx, sigs); err != nil {
		_, intr := errors.AsType[*ErrInterrupted](err)
		if noProgram != nil && !intr && !errors.Is(err, ErrBadConfig) {
			// The rendezvous failed before it could be called off (node
			// 0's store never came, the rank was taken): the program is
			// still why this node does not run, bad usage as on one node.
			return fmt.Errorf("launcher: node %d: %w (and the other nodes could not be told: %v)", cfg.NodeRank, noProgram, err)
		}
		return err
	}
	if j.client != nil {
		defer j.client.Close()
	}
	cfg.Logf("workers get MASTER_ADDR=%s MASTER_PORT=%d (free for torch's store), SLIME_STORE_PORT=%d", j.workerAddr, j.torchPort, cfg.MasterPort)

	if cfg.NNodes > 1 && j.srv == nil && j.storeAddr != "" {
		ectx, ecancel := context.WithCancel(context.Background())
		ended := make(chan struct{})
		go func() { defer close(ended); j.watchEnd(ectx) }()
		defer func() { ecancel(); <-ended }()
		// Should this launcher be killed, its guard tells the other nodes.
		j.guard.tellStore(j.storeAddr, cfg.RunID, cfg.NodeRank, cfg.NodeRank*cfg.NProcPerNode, cfg.MaxRestarts, cfg.JobSecret)
	}
	for attempt := 0; ; attempt++ {
		j.guard.attempt(attempt)
		err := j.runAttempt(ctx, attempt, sigs)
		if err == nil && j.srv != nil && cfg.NNodes > 1 {
			if serr := j.srv.Set(endKey(cfg.RunID), nil); serr != nil {
				cfg.Warnf("node 0: could not tell the other nodes that its workers ended: %v", serr)
			}
		}
		if removed, _ := shm.RemovePrefix(shm.JobPrefix(cfg.RunID)); len(removed) > 0 {
			cfg.Logf("removed %d shared-memory segment(s) the workers left: %v", len(removed), removed)
		}
		if betweenAttempts != nil {
			betweenAttempts(cfg.NodeRank, sigs)
		}
		// The other nodes may wait at the next attempt's start
		// (startTogether): a node that ends the job fails their wait at
		// once, naming why, after a success too (a node whose workers
		// have all ended cannot take part in a restart that another
		// node's later failure would start). Where node 0 has ended, its
		// store is going: the others learn that from node0Ended, and
		// nothing is sent to it.
		end := func(err error) error {
			if cfg.NNodes > 1 && j.storeAddr != "" && (j.srv != nil || !j.node0Ended.Load()) {
				j.abort(attempt+1, cfg.NodeRank*cfg.NProcPerNode, endedReason(cfg.NodeRank, attempt, err), true)
				j.aborts.Wait()
			}
			return err
		}
		if _, ok := errors.AsType[*UnreapedError](err); ok {
			return end(err) // no attempt beside workers that could not be reaped
		}
		var we *WorkerError
		var re *RemoteError
		if err == nil || !errors.As(err, &we) && !errors.As(err, &re) || attempt >= cfg.MaxRestarts {
			return end(err)
		}
		if re != nil && (re.Interrupted || re.NotStarted || re.Lost) { // another node was stopped, did not start its workers, or died: so is the job
			return end(err)
		}
		// A signal that came after the attempt's last worker ended stops
		// the job here, before another attempt's workers start.
		select {
		case s := <-sigs:
			if cfg.NNodes > 1 { // the other nodes' next attempt waits for this one's workers
				j.abort(attempt+1, cfg.NodeRank*cfg.NProcPerNode, interruptedReason(cfg.NodeRank, s), true)
				j.aborts.Wait()
			}
			return fmt.Errorf("launcher: node %d: %w before restarting the workers after: %v", cfg.NodeRank, &ErrInterrupted{Signal: s}, err)
		case <-ctx.Done(): // as a signal, as in runAttempt
			if cfg.NNodes > 1 {
				j.abort(attempt+1, cfg.NodeRank*cfg.NProcPerNode, cancelledReason(cfg.NodeRank), true)
				j.aborts.Wait()
			}
			return fmt.Errorf("launcher: node %d: %w (Run's context was cancelled) before restarting the workers after: %v", cfg.NodeRank, &ErrInterrupted{Signal: syscall.SIGTERM}, err)
		default:
		}
		cfg.Logf("%v; restarting the workers (%d of %d restarts)", err, attempt+1, cfg.MaxRestarts)
		if cfg.NNodes > 1 {
			if serr := j.startTogether(ctx, attempt+1, sigs); serr != nil {
				return serr
			}
		}
	}
}

// hupIgnored says that SIGHUP was ignored when the process started
// (nohup slimerun ...): it stays ignored, for the launcher and, inherited,
// its workers, so that the job outlives the terminal as nohup means; a
// handler for it would take the hangup as a request to stop the job.
// Read at start: once a Run has asked for SIGHUP, signal.Ignored no
// longer says.
var hupIgnored = signal.Ignored(syscall.SIGHUP)

// endedReason is how a node that ends the job after an attempt (failed,
// or err nil: its workers all exited 0) tells the nodes that may wait
// for it at the next attempt's start.
func endedReason(node, attempt int, err error) string {
	if err == nil {
		return fmt.Sprintf("node %d ended the job after its attempt %d: its workers all exited 0", node, attempt)
	}
	return fmt.Sprintf("node %d ended the job after its attempt %d, without a restart: %v", node, attempt, err)
}

// startKey is the barrier every node's launcher joins before attempt n
// (n ≥ 1) of a job across nodes, and portKey where node 0 publishes that
// attempt's MASTER_PORT. Both lie under failedPrefix(n): a node's
// failure, death (its guard), signal or end aborts it, and the others'
// waits there fail at once.
func startKey(runID string, n int) string { return failedPrefix(runID, n) + "start" }
func portKey(runID string, n int) string  { return failedPrefix(runID, n) + "master_port" }

// startTogether is the start of attempt n (n ≥ 1) across nodes: each
// node's launcher comes once its own workers of attempt n-1 are gone, and
// none starts its workers before every node has come, so that no worker
// of attempt n meets a worker of attempt n-1 still stopping on another
// node (a rank 0 whose SIGTERM handler saves a checkpoint still serves
// torch's store, which a new rank 1 would join and wait in for good). For
// the same reason node 0 picks each attempt a MASTER_PORT of its own, and
// publishes it before it comes. The wait is bounded by RdzvTimeout, or
// the stop grace and reapBound where longer (a node still stopping its
// workers takes that long), and ends at once when another node aborts the
// attempt (it ended the job, after a failure or a success, was stopped,
// or died), when node 0 has ended or its store is gone, or when this node
// is stopped (SIGINT, SIGTERM, SIGHUP, SIGQUIT, or ctx), which it tells
// the others; a signal that comes as the nodes pass the barrier stops the
// job there too.
func (j *job) startTogether(ctx context.Context, n int, sigs chan os.Signal) error {
	cfg := j.cfg
	rank := cfg.NodeRank * cfg.NProcPerNode
	bctx, cancel := context.WithTimeout(ctx, max(cfg.RdzvTimeout, cfg.StopGrace+reapBound+10*time.Second))
	defer cancel()
	stopped := make(chan os.Signal, 1)
	wctx, wcancel := context.WithCancel(bctx)
	var watch sync.WaitGroup
	watch.Go(func() {
		select {
		case s := <-sigs:
			stopped <- s
			wcancel()
		case <-wctx.Done():
		}
	})
	err := j.meet(wctx, n)
	wcancel()
	watch.Wait() // a signal it took is in stopped now
	fail := func(reason string, err error) error {
		j.abort(n, rank, reason, true)
		j.aborts.Wait()
		return err
	}
	select {
	case s := <-stopped:
		// Also where the barrier passed: the others' workers of attempt
		// n, started by then, are stopped by this abort of it.
		return fail(interruptedReason(cfg.NodeRank, s), fmt.Errorf("launcher: node %d: %w while the nodes met to restart the workers (attempt %d)", cfg.NodeRank, &ErrInterrupted{Signal: s}, n))
	default:
	}
	if ctx.Err() != nil {
		return fail(cancelledReason(cfg.NodeRank), fmt.Errorf("launcher: node %d: %w (Run's context was cancelled) while the nodes met to restart the workers (attempt %d)", cfg.NodeRank, &ErrInterrupted{Signal: syscall.SIGTERM}, n))
	}
	if err == nil {
		cfg.Logf("node %d: every node has stopped its workers; attempt %d's get MASTER_PORT=%d", cfg.NodeRank, n, j.torchPort)
		return nil
	}
	if ae, ok := errors.AsType[*rendezvous.AbortError](err); ok {
		// Another node ended the job, was stopped or died: the reason
		// (read from the store, made printable) says which.
		return fmt.Errorf("launcher: node %d: the workers were not restarted (attempt %d): %s", cfg.NodeRank, n, printable(ae.Reason, 512))
	}
	if errors.Is(err, errNode0Gone) {
		return fmt.Errorf("launcher: node %d: the workers were not restarted (attempt %d): %w", cfg.NodeRank, n, err)
	}
	why := err.Error()
	if me, ok := errors.AsType[*rendezvous.MissingError](err); ok {
		why = fmt.Sprintf("node rank(s) %v did not come to restart the workers in time: %v", me.Missing, me.Err)
		if me.AllArrived {
			why = fmt.Sprintf("every node came to restart the workers, but one did not finish (its launcher failed in between): %v", me.Err)
		}
	}
	return fail(fmt.Sprintf("node %d gave up restarting the workers (attempt %d): %s", cfg.NodeRank, n, why), fmt.Errorf("launcher: node %d: restart (attempt %d): %s", cfg.NodeRank, n, why))
}

// errNode0Gone: node 0 has ended, or its store is out of reach, as
// another node is about to restart its workers.
var errNode0Gone = errors.New("node 0 has ended the job, or its launcher died")

// meet is startTogether's wait: node 0 publishes attempt n's MASTER_PORT,
// every node joins the barrier, and the others read the port. Node 0
// dials its own store; the others reach it as the failure watch does
// (reach: a refused connect means at once that node 0's store is gone,
// where a dial would retry until the bound), on a connection of their
// own (a call that a signal cuts short leaves it unusable; the aborts go
// through job.client).
func (j *job) meet(ctx context.Context, n int) error {
	cfg := j.cfg
	var st *rendezvous.Client
	var err error
	if j.srv != nil {
		if st, err = rendezvous.Dial(ctx, j.storeAddr, cfg.auth()); err != nil {
			return err
		}
	} else {
		if j.node0Ended.Load() {
			return fmt.Errorf("%w: node 0 said its workers had all ended", errNode0Gone)
		}
		if st, err = j.reach(ctx); err != nil {
			if ctx.Err() != nil {
				return err
			}
			return fmt.Errorf("%w: its store at %s is out of reach: %v", errNode0Gone, j.storeAddr, err)
		}
		if j.node0Ended.Load() {
			st.Close()
			return fmt.Errorf("%w: node 0 said its workers had all ended", errNode0Gone)
		}
	}
	defer st.Close()
	if j.srv != nil {
		port, err := freePort(j.bindHost)
		if err == nil {
			err = st.Set(ctx, portKey(cfg.RunID, n), []byte(strconv.Itoa(port)))
		}
		if err != nil {
			return fmt.Errorf("the MASTER_PORT of attempt %d: %w", n, err)
		}
		j.torchPort = port
	}
	if err := st.Barrier(ctx, startKey(cfg.RunID, n), cfg.NodeRank, cfg.NNodes); err != nil {
		if j.srv == nil && ctx.Err() == nil && (errors.Is(err, rendezvous.ErrConnLost) || errors.Is(err, rendezvous.ErrUnreachable)) {
			return fmt.Errorf("%w: its store at %s was lost: %v", errNode0Gone, j.storeAddr, err)
		}
		return err
	}
	if j.srv == nil {
		v, err := st.Get(ctx, portKey(cfg.RunID, n))
		if err != nil {
			return err
		}
		p, perr := strconv.Atoi(string(v))
		if perr != nil || p <= 0 || p > 65535 {
			return fmt.Errorf("node 0 published MASTER_PORT %q for attempt %d, not a port", printable(string(v), 64), n)
		}
		j.torchPort = p
	}
	return nil
}

// betweenAttempts, when a test sets it, runs after each attempt, before
// the launcher decides whether to restart (a signal put in sigs then
// arrives between two attempts).
var betweenAttempts func(node int, sigs chan<- os.Signal)

// storeGrace is how long node 0's store outlives its own workers, waiting
// for the other nodes' launchers and workers to hang up: none on one node.
func storeGrace(cfg *Config) time.Duration {
	if cfg.NNodes == 1 {
		return 0
	}
	return 10 * time.Second
}

// ephemeralRange reads the kernel's range of ports for outgoing
// connections (ip_local_port_range); ok false where it cannot.
func ephemeralRange() (lo, hi int, ok bool) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0, false
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0, false
	}
	lo, err1 := strconv.Atoi(f[0])
	hi, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || lo < 1 || hi < lo || hi > 65535 {
		return 0, 0, false
	}
	return lo, hi, true
}

// freePort returns a TCP port free a moment ago on every address (torch's
// store binds the wildcard, not host alone): the workers' MASTER_PORT,
// which rank 0's torch binds for its own store. It probes a random port
// below the kernel's ephemeral range (ephemeralRange) by binding it and
// closing: there no outgoing connection of any process can take it
// before torch binds it, as one could a port the kernel handed out for
// port 0 (another process may still bind it in between: the window is
// the workers' start-up). Where the range is unknown, or 64 probes find
// nothing free, it takes port 0's. host, the address the launcher binds,
// is probed too.
func freePort(host string) (int, error) {
	probe := func(p int) (int, bool) {
		l, err := net.Listen("tcp", ":"+strconv.Itoa(p))
		if err != nil {
			return 0, false
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if h, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port))); err == nil {
			h.Close()
			return port, true
		}
		return 0, false
	}
	if lo, _, ok := ephemeralRange(); ok && lo > freePortMin+1024 {
		for range 64 {
			if p, ok := probe(freePortMin + mrand.IntN(lo-freePortMin)); ok {
				return p, nil
			}
		}
	}
	for range 8 {
		if p, ok := probe(0); ok {
			return p, nil
		}
	}
	return 0, fmt.Errorf("launcher: no port free on every address (and on %s) for MASTER_PORT", host)
}

// freePortMin is the lowest port freePort probes: below it lie the
// well-known and commonly configured services' ports.
const freePortMin = 10000

// nodesPrefix starts the store keys of the launchers' own rendezvous (the
// node claims, MASTER_PORT, placements, the node barrier): a node that
// gives up the rendezvous aborts it, so that the others fail at once.
func nodesPrefix(runID string) string { return "slimerun/" + runID + "/" }

// nodesBarrier is the barrier every node's launcher joins once it has
// claimed its rank and published its placement (joinNodes).
func nodesBarrier(runID string) string { return nodesPrefix(runID) + "nodes" }

// claimKey is where the launcher that takes node rank n records itself
// (nodeInfo), once: a second launcher given the same rank finds it taken.
func claimKey(runID string, n int) string { return nodesPrefix(runID) + "node/" + strconv.Itoa(n) }

// nodeInfo is what a node's launcher publishes of itself when it claims
// its node rank: what it was given, which every node must share, and who
// it is, to name it.
type nodeInfo struct {
	NNodes, NProcPerNode int
	// Restarts is the node's --max-restarts: a node that restarts its
	// workers where another gives up would wait for that one's workers.
	Restarts   int
	Host, Addr string
	Pid        int
	// Machine is machine.PIDSpace() of the launcher: where it equals this
	// launcher's, Pid is a process this one can see.
	Machine string
}

func (n nodeInfo) encode() []byte {
	return fmt.Appendf(nil, "nnodes=%d nproc=%d restarts=%d host=%s addr=%s pid=%d machine=%s", n.NNodes, n.NProcPerNode, n.Restarts, n.Host, n.Addr, n.Pid, n.Machine)
}

// dead says whether n is a launcher of this machine and pid namespace
// whose process has exited.
func (n nodeInfo) dead() bool {
	return machine.SamePIDSpace(n.Machine, machine.PIDSpace()) && !machine.Alive(n.Pid)
}

// parseNodeInfo reads what encode wrote; fields it does not know are
// skipped, missing ones left zero.
func parseNodeInfo(b []byte) (nodeInfo, error) {
	var n nodeInfo
	for f := range strings.FieldsSeq(string(b)) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return n, fmt.Errorf("node record %.128q: %.64q is not key=value", b, f)
		}
		var err error
		switch k {
		case "nnodes":
			n.NNodes, err = strconv.Atoi(v)
		case "nproc":
			n.NProcPerNode, err = strconv.Atoi(v)
		case "restarts":
			if n.Restarts, err = strconv.Atoi(v); err == nil && n.Restarts < 0 {
				err = errors.New("negative")
			}
		case "host":
			n.Host = v
		case "addr":
			n.Addr = v
		case "pid":
			n.Pid, err = strconv.Atoi(v)
		case "machine":
			n.Machine = v
		}
		if err != nil {
			if ne, ok := errors.AsType[*strconv.NumError](err); ok {
				err = ne.Err // without the whole value again
			}
			return n, fmt.Errorf("node record %.128q: %s=%.32q: %v", b, k, v, err)
		}
	}
	if n.NNodes < 1 || n.NProcPerNode < 1 {
		return n, fmt.Errorf("node record %.128q: no node or worker count", b)
	}
	return n, nil
}

// who names a node's launcher: "host h, pid 123, address 10.0.0.2".
func (n nodeInfo) who() string {
	// Read from the store: printable, as RemoteError's reason.
	s := fmt.Sprintf("host %s, pid %d", printable(n.Host, 256), n.Pid)
	if n.Addr != "" {
		s += ", address " + printable(n.Addr, 256)
	}
	return s
}

// given is what a node was given that every node must share.
func (n nodeInfo) given() string {
	return fmt.Sprintf("--nnodes %d --nproc-per-node %d --max-restarts %d", n.NNodes, n.NProcPerNode, n.Restarts)
}

// joinInterruptible is joinNodes, called off by a SIGINT, SIGTERM, SIGHUP or
// SIGQUIT (sigs) that arrives meanwhile: the rendezvous ends at once with
// ErrInterrupted, and the other nodes are told through the store (as of a
// node that gives up), where the signal's default action would end the
// launcher without a word and leave them waiting out the rendezvous
// timeout. A signal that comes as the node joins goes back to sigs, for
// the attempt to handle as any other; the error of a rendezvous that
// failed as the signal came is logged.
func (j *job) joinInterruptible(ctx context.Context, sigs chan os.Signal) error {
	jctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	done, caught := make(chan struct{}), make(chan os.Signal, 1)
	var watch sync.WaitGroup
	watch.Go(func() {
		select {
		case s := <-sigs:
			caught <- s
			cancel(&ErrInterrupted{Signal: s})
		case <-done:
		}
	})
	err := j.joinNodes(jctx)
	close(done)
	watch.Wait()
	select {
	case s := <-caught:
		if err == nil {
			select {
			case sigs <- s:
			default: // sigs is full: signals enough to stop the attempt
			}
			return nil
		}
		if _, intr := errors.AsType[*ErrInterrupted](err); !intr && !errors.Is(err, context.Canceled) {
			// What the cancelled call reported (a dial that was still
			// trying), or a failure the signal came upon: said, not lost.
			j.cfg.Logf("node %d: as the signal came: %v", j.cfg.NodeRank, err)
		}
		return fmt.Errorf("launcher: node %d: the rendezvous: %w", j.cfg.NodeRank, &ErrInterrupted{Signal: s})
	default:
		return err
	}
}

// tellLateNodes, on node 0 once it has called the rendezvous off, serves
// the store for up to lateGrace more, until every other node has reached
// the node barrier (and so hears of the call-off in its wait there, on a
// connection the store's Shutdown still serves): a node started just
// after node 0 would otherwise find the store gone and fail only at its
// rendezvous timeout. Its claim is not enough: between the claim and the
// barrier a node dials a second connection (job.watch), which a store
// that stopped listening refuses until that node's timeout. A node later
// still does.
func (j *job) tellLateNodes(ctx context.Context, st *rendezvous.Client) {
	ctx, cancel := context.WithTimeout(ctx, lateGrace)
	defer cancel()
	for n := 1; n < j.cfg.NNodes; n++ {
		for {
			ok, err := st.Check(ctx, rendezvous.BarrierKey(nodesBarrier(j.cfg.RunID), n))
			if err != nil {
				return
			}
			if ok {
				break
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
}

// lateGrace bounds tellLateNodes.
const lateGrace = 10 * time.Second

// joinNodes waits until every node's launcher has reached the store, so
// that a node that never arrives is reported by rank. Each node first
// claims its node rank (claimKey), publishing its node and worker counts:
// a launcher that finds its rank taken gives up alone, naming the one
// that holds it, and leaves that one's job be (it may be whole: the same
// command started twice; if a node is missing instead, the others name
// it at RdzvTimeout). Node 0 publishes the workers' MASTER_PORT (PortKey)
// before it joins the barrier; the others read it and node 0's claim
// before they join, refuse counts other than node 0's, and keep their
// connection for aborts. A node that fails once it holds its rank aborts
// the launchers' rendezvous (nodesPrefix) with its reason, so that the
// other nodes fail at once, naming it, instead of at their timeout or, if
// their counts let them pass, in their workers' Init.
func (j *job) joinNodes(ctx context.Context) error {
	cfg := j.cfg
	if cfg.NNodes == 1 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.RdzvTimeout)
	defer cancel()
	addr := net.JoinHostPort(cfg.MasterAddr, strconv.Itoa(cfg.MasterPort))
	if j.srv != nil {
		// Node 0 reaches its own store where it bound it.
		addr = net.JoinHostPort(j.bindHost, strconv.Itoa(cfg.MasterPort))
	}
	j.storeAddr = addr
	what := fmt.Sprintf("for node 0's store at %s (is node 0's slimerun running, with the same --master-addr and --master-port?)", addr)
	if j.srv != nil {
		what = "for its own store at " + addr
	}
	stopNotice := waitNotice(cfg, what)
	st, err := rendezvous.Dial(ctx, addr, cfg.auth())
	stopNotice()
	if err != nil {
		return fmt.Errorf("launcher: node %d: %w", cfg.NodeRank, err)
	}
	keep := false
	defer func() {
		if !keep {
			st.Close()
		}
	}()
	host, _ := os.Hostname()
	ip, _ := netaddr.LocalIP("", cfg.MasterAddr) // "" where there is no route: the record names the host and pid still
	self := nodeInfo{NNodes: cfg.NNodes, NProcPerNode: cfg.NProcPerNode, Restarts: cfg.MaxRestarts, Host: host, Addr: ip, Pid: os.Getpid(), Machine: machine.PIDSpace()}
	v, ok, err := st.CompareAndSet(ctx, claimKey(cfg.RunID, cfg.NodeRank), nil, self.encode())
	if err != nil {
		return fmt.Errorf("launcher: node %d: claim node rank %d: %w", cfg.NodeRank, cfg.NodeRank, err)
	}
	if n, perr := parseNodeInfo(v); !ok && perr == nil && n.dead() {
		// A launcher of this machine that held the rank has exited
		// (killed during the rendezvous, and started again): take over
		// its claim, unless another took it meanwhile.
		cfg.Logf("node %d: node rank %d was claimed by %s, which has exited: taking it over", cfg.NodeRank, cfg.NodeRank, n.who())
		if v, ok, err = st.CompareAndSet(ctx, claimKey(cfg.RunID, cfg.NodeRank), v, self.encode()); err != nil {
			return fmt.Errorf("launcher: node %d: claim node rank %d: %w", cfg.NodeRank, cfg.NodeRank, err)
		}
	}
	if !ok {
		other := string(v)
		if n, err := parseNodeInfo(v); err == nil {
			other = n.who()
		}
		return fmt.Errorf("launcher: node %d: node rank %d is already taken by %s; this launcher (%s) gives up and leaves that one's job be: give every node its own --node-rank", cfg.NodeRank, cfg.NodeRank, other, self.who())
	}
	// From here on this node holds its rank: if it fails, the others are
	// told at once.
	fail := func(err error) error {
		if intr, ok := errors.AsType[*ErrInterrupted](context.Cause(ctx)); ok && ctx.Err() != nil {
			err = fmt.Errorf("node %d was %w during the rendezvous", cfg.NodeRank, intr)
		}
		if _, aborted := errors.AsType[*rendezvous.AbortError](err); !aborted {
			actx, acancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer acancel()
			aerr := st.Abort(actx, nodesPrefix(cfg.RunID), cfg.NodeRank, err.Error())
			if aerr != nil && ctx.Err() != nil {
				// The call that ctx cut short left the connection
				// unusable: tell the store on a new one.
				var st2 *rendezvous.Client
				if st2, aerr = rendezvous.Dial(actx, addr, cfg.auth()); aerr == nil {
					aerr = st2.Abort(actx, nodesPrefix(cfg.RunID), cfg.NodeRank, err.Error())
					st2.Close()
				}
			}
			if aerr != nil {
				cfg.Logf("node %d: could not tell the store that this node gave up: %v", cfg.NodeRank, aerr)
			}
		}
		return fmt.Errorf("launcher: node %d: %w", cfg.NodeRank, err)
	}
	if cfg.NodeRank == 0 {
		if err := st.Set(ctx, PortKey(cfg.RunID), []byte(strconv.Itoa(j.torchPort))); err != nil {
			return fail(fmt.Errorf("publish MASTER_PORT: %w", err))
		}
	}
	if cfg.NodeRank != 0 {
		// Node 0 published it before it joined the barrier; read it before
		// joining, while node 0 surely still serves.
		v, err := st.Get(ctx, PortKey(cfg.RunID))
		if err != nil {
			return fail(fmt.Errorf("read MASTER_PORT from node 0's store: %w", err))
		}
		p, err := strconv.Atoi(string(v))
		if err != nil || p <= 0 || p > 65535 {
			return fail(fmt.Errorf("node 0 published MASTER_PORT %.32q, not a port", v))
		}
		j.torchPort = p
		// Node 0 claimed its rank before it published MASTER_PORT.
		v, err = st.Get(ctx, claimKey(cfg.RunID, 0))
		if err != nil {
			return fail(fmt.Errorf("read node 0's counts: %w", err))
		}
		n0, err := parseNodeInfo(v)
		if err != nil {
			return fail(fmt.Errorf("node 0 published a bad %w", err))
		}
		if n0.NNodes != self.NNodes || n0.NProcPerNode != self.NProcPerNode || n0.Restarts != self.Restarts {
			return fail(fmt.Errorf("node %d (%s) was given %s, node 0 (%s) %s: every node must be given the same", cfg.NodeRank, self.who(), self.given(), n0.who(), n0.given()))
		}
	}
	if j.noProgram != nil {
		err := fail(fmt.Errorf("node %d cannot run the program: %w", cfg.NodeRank, j.noProgram))
		if j.srv != nil {
			j.tellLateNodes(ctx, st)
		}
		return err
	}
	mine := cfg.cpus
	if !cfg.BindToCore {
		mine, _ = allowedCPUs()
	}
	me := placement(mine)
	if err := st.Set(ctx, placeKey(cfg.RunID, cfg.NodeRank), []byte(me)); err != nil {
		return fail(fmt.Errorf("publish this node's machine and CPUs: %w", err))
	}
	// The first attempt's failure watch, dialed while node 0 surely
	// serves (see job.watch).
	if j.watch, err = rendezvous.Dial(ctx, addr, cfg.auth()); err != nil {
		return fail(fmt.Errorf("connect to watch the other nodes' workers: %w", err))
	}
	stopNotice = waitNotice(cfg, fmt.Sprintf("for the other %d node(s) to join at the store %s", cfg.NNodes-1, addr))
	err = st.Barrier(ctx, nodesBarrier(cfg.RunID), cfg.NodeRank, cfg.NNodes)
	stopNotice()
	if err != nil {
		if ae, ok := errors.AsType[*rendezvous.AbortError](err); ok {
			return fmt.Errorf("launcher: node %d: the rendezvous was called off: %w", cfg.NodeRank, ae)
		}
		if j.srv == nil && (errors.Is(err, rendezvous.ErrConnLost) || errors.Is(err, rendezvous.ErrUnreachable)) {
			// Not a node that did not join: there is no store left to
			// tell, nor to ask which nodes had come.
			if me, ok := errors.AsType[*rendezvous.MissingError](err); ok {
				err = me.Err
			}
			return fmt.Errorf("launcher: node %d: node 0's store at %s was lost during the rendezvous (node 0's launcher died, or its host or the link to it did): %w", cfg.NodeRank, addr, err)
		}
		var me *rendezvous.MissingError
		if errors.As(err, &me) {
			refused := ""
			if n := j.refused.Load(); n > 0 {
				// Not proven to be the missing nodes' (a refused
				// connection proved nothing), but likely.
				refused = fmt.Sprintf(" (the store refused %d connection(s) meanwhile, not this job's: a node given another SLIME_JOB_SECRET or run id?)", n)
			}
			if me.AllArrived {
				return fail(fmt.Errorf("node %d gave up: every node came, but one did not finish joining within %v (its launcher failed in between): %w", cfg.NodeRank, cfg.RdzvTimeout, me.Err))
			}
			return fail(fmt.Errorf("node %d gave up: node rank(s) %v did not join within %v%s: %w", cfg.NodeRank, me.Missing, cfg.RdzvTimeout, refused, me.Err))
		}
		return fail(err)
	}
	// Past the barrier the other nodes start their workers: a node that
	// gives up now fails the first attempt as a worker that could not
	// start does (failedPrefix, then the attempt's waits, with a start
	// failure's reason), so that they end at once, and do not restart,
	// rather than wait for its ranks.
	failStarted := func(err error) error {
		// A start failure's reason (isStartFailure): the job ends, with no
		// restart, as where a worker could not start.
		rank := cfg.NodeRank * cfg.NProcPerNode
		reason := startError(rank, fmt.Errorf("node %d gave up before it started its workers: %v", cfg.NodeRank, err)).Error()
		actx, acancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer acancel()
		aerr := st.Abort(actx, failedPrefix(cfg.RunID, 0), rank, reason)
		if aerr == nil {
			aerr = st.Abort(actx, rendezvous.AttemptPrefix(cfg.RunID, 0), rank, reason)
		}
		if aerr != nil {
			cfg.Logf("node %d: could not tell the other nodes that it gave up: %v", cfg.NodeRank, aerr)
		}
		return fmt.Errorf("launcher: node %d: %w", cfg.NodeRank, err)
	}
	if cfg.BindToCore {
		// Every node published before it joined the barrier.
		myHost, myCPUs, _ := parsePlacement([]byte(me))
		for n := range cfg.NodeRank {
			v, err := st.Get(ctx, placeKey(cfg.RunID, n))
			if err != nil {
				return failStarted(fmt.Errorf("read node %d's machine and CPUs: %w", n, err))
			}
			host, cpus, err := parsePlacement(v)
			if err != nil {
				return failStarted(fmt.Errorf("node %d published a bad %w", n, err))
			}
			if sharesCPUs(myHost, myCPUs, host, cpus) {
				j.cpuBase += cfg.NProcPerNode
			}
		}
		if j.cpuBase > 0 {
			cfg.Logf("node %d shares its machine's CPUs with %d rank(s) of earlier nodes: its local rank 0 is bound to CPU slot %d of %d", cfg.NodeRank, j.cpuBase, j.cpuBase%len(cfg.cpus), len(cfg.cpus))
		}
	}
	if cfg.NodeRank != 0 {
		j.client, keep = st, true
	}
	return nil
}

// abort fails the attempt's store waits at once, naming the worker that
// exited: through the server on node 0, through the connection to it
// elsewhere (in the background, bounded, so that supervision goes on).
// Aborts reach the store in the order of the calls (the store keeps the
// first): a worker that did not start is named, not the workers stopped
// because of it. Only the supervising goroutine calls it.
// A failure (failed) is also told to the other nodes' launchers
// (failedPrefix).
func (j *job) abort(attempt, rank int, reason string, failed bool) {
	// A failure reaches the other nodes' launchers (failedPrefix) before
	// the attempt's waits fail: a worker there that the attempt's abort
	// fails would otherwise be reported first, as a failure of its own
	// node, and the store would keep that report, not this one (a
	// start failure or a signal here, which must end the job everywhere,
	// would then read as a worker's failure, which restarts it).
	prefix := rendezvous.AttemptPrefix(j.cfg.RunID, attempt)
	if j.srv != nil {
		if failed {
			j.srv.Abort(failedPrefix(j.cfg.RunID, attempt), rank, reason)
		}
		j.srv.Abort(prefix, rank, reason)
		return
	}
	if j.client == nil {
		return
	}
	j.aborts.Add(1)
	prev, done := j.lastAbort, make(chan struct{})
	j.lastAbort = done
	// The bound counts from the call, the wait for the one before included.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	go func() {
		defer j.aborts.Done()
		defer close(done)
		defer cancel()
		if prev != nil {
			select {
			case <-prev:
			case <-ctx.Done():
			}
		}
		if testHookAbort != nil {
			testHookAbort(rank)
		}
		// Once node 0 has said it ended, its store is going: a failure to
		// reach it is no news, and not said.
		if failed {
			if err := j.client.Abort(ctx, failedPrefix(j.cfg.RunID, attempt), rank, reason); err != nil && !j.node0Ended.Load() {
				j.cfg.Logf("node %d: could not tell the other nodes that %s: %v", j.cfg.NodeRank, reason, err)
			}
		}
		if err := j.client.Abort(ctx, prefix, rank, reason); err != nil && !j.node0Ended.Load() {
			j.cfg.Logf("node %d: could not tell the store that %s: %v", j.cfg.NodeRank, reason, err)
		}
	}()
}

// watchFailures waits, on a connection of its own, for another node to
// report a failed worker of the attempt (failedPrefix) and sends what it
// reported on remote. It returns when ctx ends, or when the store cannot
// be reached: once node 0 said it ended (endKey, node0Ended), that is
// node 0's end; before, it dials again (reach), and a store still out of
// reach is node 0's death, sent on remote as a failure of node 0's first
// rank (storeLostReason). A store that answers again (node 0 was only
// slow) is watched on.
func (j *job) watchFailures(ctx context.Context, attempt int, remote chan<- *rendezvous.AbortError, st *rendezvous.Client) {
	prefix := failedPrefix(j.cfg.RunID, attempt)
	ended := func() bool { return j.srv != nil || j.node0Ended.Load() } // node 0 ends its own store
	lost := func(err error) {
		if !ended() && ctx.Err() == nil {
			remote <- &rendezvous.AbortError{Prefix: prefix, Rank: 0, Reason: storeLostReason(j.storeAddr, attempt, err)}
		}
	}
	if st == nil {
		var err error
		if st, err = j.reach(ctx); err != nil {
			lost(err)
			return
		}
	}
	defer func() { // a cancelled wait leaves it unusable
		if st != nil {
			st.Close()
		}
	}()
	for {
		if watchTimeout > 0 {
			st.Timeout = watchTimeout
		}
		err := st.Wait(ctx, prefix+"none") // never set: only an abort ends the wait
		if ae, ok := errors.AsType[*rendezvous.AbortError](err); ok {
			if ae.Prefix == prefix { // not a broader prefix some member aborted
				remote <- ae
			}
			return
		}
		if errors.Is(err, rendezvous.ErrTimeout) {
			continue
		}
		if err == nil || ended() || ctx.Err() != nil {
			return
		}
		st.Close()
		var rerr error
		if st, rerr = j.reach(ctx); rerr != nil {
			lost(fmt.Errorf("%v; dialled again: %w", err, rerr))
			return
		}
	}
}

// watchEnd waits, on a connection of its own, for node 0 to say it ended
// (endKey), and records it in node0Ended, for the whole run of a node
// other than node 0: between attempts too, when no failure watch runs. A
// connection that fails is dialled again (reach); a store out of reach
// ends it (the failure watches say what that means).
func (j *job) watchEnd(ctx context.Context) {
	st, err := j.reach(ctx)
	if err != nil {
		return
	}
	defer func() {
		if st != nil {
			st.Close()
		}
	}()
	for {
		if watchTimeout > 0 {
			st.Timeout = watchTimeout
		}
		err := st.Wait(ctx, endKey(j.cfg.RunID))
		if err == nil {
			j.node0Ended.Store(true)
			return
		}
		if errors.Is(err, rendezvous.ErrTimeout) {
			continue
		}
		st.Close()
		st = nil
		if ctx.Err() != nil {
			return
		}
		if st, err = j.reach(ctx); err != nil {
			return
		}
	}
}

// storeLostBound bounds how long a launcher tries to reach node 0's store
// again, once the connection it watched on failed, before it takes node
// 0 for dead; a store that refuses the connection (nothing listens: node
// 0's launcher is gone) is dead at once.
const storeLostBound = 10 * time.Second

// watchTimeout, when set (tests only), bounds each wait of watchFailures
// and watchEnd (default: the client's, rendezvous.DefaultTimeout).
var watchTimeout time.Duration

// reach dials node 0's store for watchFailures and watchEnd, within
// storeLostBound, and records in node0Ended whether node 0 said it ended
// (endKey); the error is the last dial's when it cannot.
func (j *job) reach(ctx context.Context) (*rendezvous.Client, error) {
	bound := time.Now().Add(storeLostBound)
	for {
		// A plain connect first: a refusal says at once that nothing
		// listens, which the store's dial would retry until its bound.
		var d net.Dialer
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		c, err := d.DialContext(dctx, "tcp", j.storeAddr)
		cancel()
		if err == nil {
			c.Close()
			dctx, cancel = context.WithTimeout(ctx, 3*time.Second)
			var st *rendezvous.Client
			if st, err = rendezvous.Dial(dctx, j.storeAddr, j.cfg.auth()); err == nil {
				var found bool
				if found, err = st.Check(dctx, endKey(j.cfg.RunID)); err == nil {
					cancel()
					if found {
						j.node0Ended.Store(true)
					}
					return st, nil
				}
				st.Close()
			}
			cancel()
		}
		if ctx.Err() != nil || errors.Is(err, syscall.ECONNREFUSED) || time.Now().After(bound) {
			return nil, err
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// testHookStarted, when set (tests only), runs once an attempt's workers
// have been started, in Run's goroutine.
var testHookStarted func(node, attempt int)

// testHookAbort, when set (tests only), runs before an abort is sent
// through the client, in the abort's goroutine.
var testHookAbort func(rank int)

// blames reads the rank each worker of the attempt blames (BlameKey):
// from the server on node 0, through the connection elsewhere (bounded).
func (j *job) blames(attempt int) map[int]int {
	world := j.cfg.NNodes * j.cfg.NProcPerNode
	out := make(map[int]int)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	for r := range world {
		key := BlameKey(j.cfg.RunID, attempt, r)
		var v []byte
		switch {
		case j.srv != nil:
			b, ok := j.srv.Lookup(key)
			if !ok {
				continue
			}
			v = b
		case j.client != nil:
			if ok, err := j.client.Check(ctx, key); err != nil || !ok {
				if err != nil {
					return out
				}
				continue
			}
			b, err := j.client.Get(ctx, key)
			if err != nil {
				continue
			}
			v = b
		default:
			return out
		}
		if b, err := strconv.Atoi(strings.TrimSpace(string(v))); err == nil && b >= 0 && b < world {
			out[r] = b
		}
	}
	return out
}

// chooseBlamed returns the rank that most of the failed workers blame: the
// voters are the workers that failed here and those that recorded whom
// they blame, less the accused itself; the accused is named when more
// than half of them blame it.
func chooseBlamed(failed []int, blames map[int]int) (int, bool) {
	votes := make(map[int]int)
	for voter, accused := range blames {
		if voter != accused {
			votes[accused]++
		}
	}
	best, n, tie := -1, 0, false
	for accused, v := range votes {
		switch {
		case v > n:
			best, n, tie = accused, v, false
		case v == n:
			tie = true
		}
	}
	if best < 0 || tie {
		return -1, false
	}
	voters := make(map[int]bool)
	for _, r := range failed {
		voters[r] = true
	}
	for r := range blames {
		voters[r] = true
	}
	delete(voters, best)
	if 2*n > len(voters) {
		return best, true
	}
	return -1, false
}

// summarize says what became of the blamed rank and of the failed
// workers: "rank 3 did not exit; ranks 0,1,2 exited with code 1".
func (j *job) summarize(blamed int, failures []*WorkerError, workers []*worker) string {
	var parts []string
	state := ""
	for _, f := range failures {
		if f.Rank == blamed {
			state = f.how()
		}
	}
	if state == "" {
		state = "is on node " + strconv.Itoa(blamed/j.cfg.NProcPerNode)
		for _, w := range workers {
			if w != nil && w.rank == blamed {
				if w.cleanExit {
					state = "exited with code 0"
				} else {
					state = "did not exit"
				}
			}
		}
	}
	parts = append(parts, fmt.Sprintf("rank %d %s", blamed, state))
	byHow := make(map[string][]int)
	var hows []string
	for _, f := range failures {
		if f.Rank == blamed {
			continue
		}
		h := f.how()
		if _, ok := byHow[h]; !ok {
			hows = append(hows, h)
		}
		byHow[h] = append(byHow[h], f.Rank)
	}
	for _, h := range hows {
		rs := byHow[h]
		slices.Sort(rs)
		s := make([]string, len(rs))
		for i, r := range rs {
			s[i] = strconv.Itoa(r)
		}
		word := "rank"
		if len(rs) > 1 {
			word = "ranks"
		}
		parts = append(parts, fmt.Sprintf("%s %s %s", word, strings.Join(s, ","), h))
	}
	return strings.Join(parts, "; ")
}

type worker struct {
	local, rank int
	cmd         *exec.Cmd
	files       []*os.File
	consoles    []*prefixWriter
	errFile     string // its TORCHELASTIC_ERROR_FILE ("" for none)
	exited      bool   // set by runAttempt's loop when waitExited returned
	cleanExit   bool   // exited 0 before the launcher stopped anyone
	// waited is closed once waitWorker has returned for it: the worker
	// has exited and can be reaped without blocking.
	waited chan struct{}
}

// exit is a worker's exit as waitExited saw it: the worker is not reaped
// yet (see group_linux.go).
type exit struct {
	w      *worker
	status syscall.WaitStatus
	err    error // waitid failed: the status is unknown
}

// failed says whether the exit is a failure: not code 0, or unknown.
func (e exit) failed() bool { return e.err != nil || e.status != 0 }

func (j *job) runAttempt(ctx context.Context, attempt int, sigs <-chan os.Signal) error {
	cfg := j.cfg
	defer j.aborts.Wait()
	var con console
	workers := make([]*worker, cfg.NProcPerNode)
	exits := make(chan exit, cfg.NProcPerNode)
	started := 0
	var startErr error
	for local := range cfg.NProcPerNode {
		w, err := j.startWorker(attempt, local, &con)
		if err != nil {
			startErr = err
			break
		}
		workers[local] = w
		started++
		j.guard.add(w.cmd.Process.Pid)
		w.waited = make(chan struct{})
		wait := waitWorker // read here: a wait may outlive Run (giveUp)
		go func() {
			st, err := wait(w.cmd.Process.Pid)
			exits <- exit{w, st, err}
			close(w.waited)
		}()
	}
	var first error
	var failures []error // worker failures before any stop, in report order
	if startErr != nil {
		first = startErr
	}
	if testHookStarted != nil {
		testHookStarted(cfg.NodeRank, attempt)
	}
	running := started
	tick := time.NewTicker(cfg.MonitorInterval)
	defer tick.Stop()
	stopping := false
	var killAt <-chan time.Time
	// reapBy ends the wait for the workers' exits reapBound after the
	// grace's SIGKILL (see reapBound).
	var reapBy <-chan time.Time
	// stop signals every worker's process group, also of workers that have
	// exited: their own children stay in the group and must not outlive
	// the job. The group ids are still the job's: no worker is reaped
	// before the loop below ends (see group_linux.go).
	// A stopped process (SIGSTOP: a debugger's, job control's) takes a
	// signal only once continued: SIGCONT follows (the signals stop sends
	// are SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGKILL), so that it ends now rather
	// than at the grace's SIGKILL.
	sigGroup := func(pgid int, sig syscall.Signal) {
		syscall.Kill(-pgid, sig)
		if sig != syscall.SIGKILL {
			syscall.Kill(-pgid, syscall.SIGCONT)
		}
	}
	stop := func(sig syscall.Signal) {
		pids := workerPids(workers)
		for _, pid := range pids {
			sigGroup(pid, sig)
		}
		// The groups of the workers' sessions that are not the workers'
		// own (job control in a script): found in /proc, signalled while
		// it shows them live.
		if _, groups, err := groupMembers(pids, false); err == nil {
			for _, g := range groups {
				if !slices.Contains(pids, g) {
					sigGroup(g, sig)
				}
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
		j.abort(attempt, cfg.NodeRank*cfg.NProcPerNode+started, startErr.Error(), true)
		startStop(syscall.SIGTERM)
	}
	// A worker of another node that fails stops this node's workers too.
	var remote chan *rendezvous.AbortError
	if cfg.NNodes > 1 && j.storeAddr != "" {
		remote = make(chan *rendezvous.AbortError, 1)
		wctx, wcancel := context.WithCancel(context.Background())
		watched := make(chan struct{})
		st := j.watch
		j.watch = nil
		go func() {
			defer close(watched)
			j.watchFailures(wctx, attempt, remote, st)
		}()
		defer func() {
			wcancel()
			<-watched
		}()
	}
	done := ctx.Done()
	// The loop runs until every worker has exited and nothing is left in
	// their process groups, or the grace's SIGKILL has been sent. What a
	// worker leaves in its group (a child that ignores SIGTERM, a
	// background job of a script) is the job's: once the launcher is
	// stopping it gets the rest of the grace, then SIGKILL with the
	// group; after a success it is stopped the same way, with a warning,
	// so that no process of the job outlives it or runs into the next
	// attempt.
	killed := false
	interrupted := false // a SIGINT came: a second one kills at once
	leftSaid, settled := false, false
	onExit := func(ex exit) {
		running--
		ex.w.exited = true
		// Whoever still waits on this attempt's keys waits in vain.
		j.abort(attempt, ex.w.rank, exitReason(ex), ex.failed() && !stopping)
		if !ex.failed() && !stopping {
			ex.w.cleanExit = true
		}
		if ex.failed() && !stopping {
			failures = append(failures, workerError(ex, attempt))
			if first == nil {
				first = failures[0]
			}
		}
	}
wait:
	for {
		if running == 0 {
			if first != nil {
				startStop(syscall.SIGTERM) // a failure that was the last exit
			}
			if killed {
				break
			}
			left, _, err := groupMembers(workerPids(workers), false)
			if err != nil {
				// Nothing can be told: end every group now.
				cfg.Logf("node %d: reading /proc for what the workers left: %v; killing their process groups", cfg.NodeRank, err)
				startStop(syscall.SIGTERM)
				break
			}
			if len(left) == 0 {
				break
			}
			if !stopping && !settled {
				// Children that their worker told to end may still be on
				// their way out: look again at the next tick.
				settled = true
			} else if !stopping {
				for _, w := range workers {
					if w == nil {
						continue
					}
					if pids := left[w.cmd.Process.Pid]; len(pids) > 0 {
						cfg.Warnf("rank %d's process group or session %d still has %d process(es) after the worker exited 0 (pids %v): stopping them as the job ends (SIGTERM, SIGKILL after %v); a process meant to outlive the job must leave the session (setsid)", w.rank, w.cmd.Process.Pid, len(pids), pids, cfg.StopGrace)
					}
				}
				startStop(syscall.SIGTERM)
				leftSaid = true
			} else if !leftSaid {
				cfg.Logf("node %d: the workers have exited; left in their process groups and sessions: %s; SIGKILL when the grace ends", cfg.NodeRank, leftText(workers, left))
				leftSaid = true
			}
		}
		select {
		case ex := <-exits:
			onExit(ex)
		case ae := <-remote:
			remote = nil
			node := -1
			if world := cfg.NNodes * cfg.NProcPerNode; ae.Rank >= 0 && ae.Rank < world {
				node = ae.Rank / cfg.NProcPerNode
			}
			if node != cfg.NodeRank && first == nil && !stopping {
				// The next tick stops the workers, as after a failure
				// here: those that saw it too have that long to say so.
				first = &RemoteError{Rank: ae.Rank, Node: node, Attempt: attempt, Reason: ae.Reason,
					Interrupted: ae.Rank == node*cfg.NProcPerNode && isInterrupted(node, ae.Reason),
					NotStarted:  node >= 0 && isStartFailure(ae.Rank, ae.Reason),
					Lost:        ae.Rank == node*cfg.NProcPerNode && isLost(node, ae.Reason)}
				// The failure itself is Run's error, which the caller
				// reports when the workers are stopped: said once.
				who := "another node"
				if node >= 0 {
					who = "node " + strconv.Itoa(node)
				}
				cfg.Logf("node %d: stopping this node's workers: %s reported a failure", cfg.NodeRank, who)
			}
		case <-tick.C:
			if first != nil {
				startStop(syscall.SIGTERM)
			}
		case s := <-sigs:
			if first == nil {
				first = &ErrInterrupted{Signal: s}
				if cfg.NNodes > 1 { // the other nodes stop theirs too
					j.abort(attempt, cfg.NodeRank*cfg.NProcPerNode, interruptedReason(cfg.NodeRank, s), true)
				}
			}
			switch {
			case s == syscall.SIGINT && interrupted && !killed:
				// A second ^C: the user means now, not at the grace's
				// end (a worker's handler may take all of it).
				cfg.Warnf("node %d: a second SIGINT: killing the workers now (SIGKILL)", cfg.NodeRank)
				stop(syscall.SIGKILL)
				killed = true
				reapBy = time.After(reapBound)
			case stopping:
				stop(s.(syscall.Signal))
			default:
				startStop(s.(syscall.Signal))
			}
			interrupted = interrupted || s == syscall.SIGINT
		case <-done:
			done = nil
			if first == nil {
				first = &ErrInterrupted{Signal: syscall.SIGTERM}
				if cfg.NNodes > 1 { // as for a signal: the other nodes stop theirs too
					j.abort(attempt, cfg.NodeRank*cfg.NProcPerNode, cancelledReason(cfg.NodeRank), true)
				}
			}
			startStop(syscall.SIGTERM)
		case <-killAt:
			stop(syscall.SIGKILL)
			killed = true
			reapBy = time.After(reapBound)
		case <-reapBy:
			// Give up on the workers that SIGKILL has not ended, once
			// the exits that came with the deadline are taken.
			for len(exits) > 0 {
				onExit(<-exits)
			}
			break wait
		}
	}
	if stopping {
		// Whatever the grace left (or a member forked while /proc was
		// read): the groups are still the job's, their leaders unreaped.
		stop(syscall.SIGKILL)
	}
	var exited, unreaped []*worker
	for _, w := range workers {
		switch {
		case w == nil:
		case w.exited:
			exited = append(exited, w)
		default:
			unreaped = append(unreaped, w)
		}
	}
	j.reap(exited)
	// A signal that came while the workers were reaped (their output
	// held open by what they left) ends the job as one before would.
	select {
	case s := <-sigs:
		if first == nil {
			first = &ErrInterrupted{Signal: s}
		}
	default:
	}
	err := j.attemptError(attempt, first, failures, workers)
	if len(unreaped) > 0 {
		return j.giveUp(unreaped, err)
	}
	return err
}

// attemptError is what ended an attempt: first, or a *JobError built from
// the failures seen before any stop when first is a worker's failure.
func (j *job) attemptError(attempt int, first error, failures []error, workers []*worker) error {
	if len(failures) > 1 {
		switch first.(type) {
		case *ErrInterrupted, *RemoteError: // the cause came first, from elsewhere
		default:
			first = rootCause(failures)
		}
	}
	we, ok := first.(*WorkerError)
	if !ok {
		return first
	}
	je := &JobError{First: we, Blamed: -1}
	var failed []int
	for _, f := range failures {
		if w, ok := f.(*WorkerError); ok {
			je.Failures = append(je.Failures, w)
			failed = append(failed, w.Rank)
		}
	}
	if b, ok := chooseBlamed(failed, j.blames(attempt)); ok {
		je.Blamed = b
		je.Summary = j.summarize(b, je.Failures, workers)
	}
	return je
}

// waitWorker is how runAttempt learns that a worker has exited:
// waitExited, which a test replaces with one that never returns, as the
// kernel's wait does for a worker killed while in uninterruptible sleep.
var waitWorker = waitExited

// noticeAfter is how long a node waits in the rendezvous before it says
// so (waitNotice), and noticeEvery how often it says so again: the wait
// lasts up to --rdzv-timeout (minutes), silent otherwise.
var noticeAfter, noticeEvery = 10 * time.Second, time.Minute

// waitNotice says through cfg.Logf, noticeAfter from now and every
// noticeEvery after that, that this node is still waiting (what: for
// whom), until stop is called.
func waitNotice(cfg *Config, what string) (stop func()) {
	start := time.Now()
	var mu sync.Mutex
	var t *time.Timer
	stopped := false
	var tick func()
	tick = func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		cfg.Logf("node %d: still waiting %s (%v of --rdzv-timeout %v)", cfg.NodeRank, what, time.Since(start).Round(time.Second), cfg.RdzvTimeout)
		t = time.AfterFunc(noticeEvery, tick)
	}
	mu.Lock()
	t = time.AfterFunc(noticeAfter, tick)
	mu.Unlock()
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}

// exitReason is what an abort tells the ranks still waiting.
func exitReason(ex exit) string {
	w, ws := ex.w, ex.status
	pid := w.cmd.Process.Pid
	switch {
	case ex.err != nil:
		return fmt.Sprintf("rank %d (pid %d) ended: %v", w.rank, pid, ex.err)
	case ws.Signaled():
		return fmt.Sprintf("rank %d (pid %d) was killed by signal %d (%v)", w.rank, pid, int(ws.Signal()), ws.Signal())
	}
	return fmt.Sprintf("rank %d (pid %d) exited with code %d", w.rank, pid, ws.ExitStatus())
}

// workerPids returns the pids of the workers started: their process
// groups' ids.
func workerPids(workers []*worker) []int {
	var pids []int
	for _, w := range workers {
		if w != nil {
			pids = append(pids, w.cmd.Process.Pid)
		}
	}
	return pids
}

// leftText says what groupMembers found in the workers' groups:
// "rank 0 (group 123): pids [125 126]; rank 1 ...".
func leftText(workers []*worker, left map[int][]int) string {
	var parts []string
	for _, w := range workers {
		if w == nil {
			continue
		}
		if pids := left[w.cmd.Process.Pid]; len(pids) > 0 {
			parts = append(parts, fmt.Sprintf("rank %d (group %d): pids %v", w.rank, w.cmd.Process.Pid, pids))
		}
	}
	return strings.Join(parts, "; ")
}

// reapBound is how long the launcher waits for the workers' exits after
// the grace's SIGKILL. A process killed in user space ends at once; one
// inside the kernel ends only when it leaves it, which takes a moment
// (freeing tens of GiB of memory, a GPU driver releasing its contexts:
// seconds) or never (uninterruptible sleep on a hung NFS mount or device,
// state D). 10 s is past the slow but sure exits, and short enough that a
// stuck worker reads as an error rather than a hung launcher. A variable
// for tests only.
var reapBound = 10 * time.Second

// UnreapedError is what Run returns when workers that the launcher killed
// (the SIGKILL at the end of the stop grace) had not exited reapBound
// later. They are left to the kernel, SIGKILL pending: the launcher does
// not wait for them, does not start another attempt beside them, and
// reaps them in the background if they ever exit while it runs.
type UnreapedError struct {
	Node    int
	Workers []UnreapedWorker
	Bound   time.Duration // reapBound
	// Cause is why the workers were stopped (the attempt's *JobError,
	// *RemoteError or *ErrInterrupted), which Unwrap returns; nil if none.
	Cause error
}

// UnreapedWorker is a worker that did not exit after SIGKILL; State is
// what /proc said of it then ("state D, in nfs_wait_bit_killable"), ""
// where it could not be read.
type UnreapedWorker struct {
	Rank, Pid int
	State     string
}

func (e *UnreapedError) Error() string {
	var ws []string
	for _, w := range e.Workers {
		s := fmt.Sprintf("rank %d (pid %d", w.Rank, w.Pid)
		if w.State != "" {
			s += ", " + w.State
		}
		ws = append(ws, s+")")
	}
	it := "it"
	if len(ws) > 1 {
		it = "they"
	}
	s := fmt.Sprintf("node %d: %s could not be reaped: %s had not exited %v after SIGKILL (a process inside the kernel, in uninterruptible sleep on a hung mount or device, ends only when it leaves it); left with SIGKILL pending",
		e.Node, strings.Join(ws, ", "), it, e.Bound)
	if e.Cause != nil {
		s += "; the workers were being stopped after: " + e.Cause.Error()
	}
	return s
}

func (e *UnreapedError) Unwrap() error { return e.Cause }

// giveUp returns the *UnreapedError for the workers whose exits did not
// come reapBound after SIGKILL, cause being why they were stopped. It
// takes their groups off the guard's list (they got SIGKILL, which the
// kernel delivers when each process leaves it: the guard's could do no
// more) and leaves each to a goroutine that reaps it, and closes its log
// files, once its exit comes, so that it is no zombie of a launcher that
// runs on (a library's caller).
func (j *job) giveUp(unreaped []*worker, cause error) error {
	e := &UnreapedError{Node: j.cfg.NodeRank, Bound: reapBound, Cause: cause}
	for _, w := range unreaped {
		pid := w.cmd.Process.Pid
		e.Workers = append(e.Workers, UnreapedWorker{Rank: w.rank, Pid: pid, State: procState(pid)})
		j.guard.drop(pid)
		go func() {
			<-w.waited
			w.cmd.Wait()
			for _, f := range w.files {
				f.Close()
			}
		}()
	}
	return e
}

// procState says what /proc shows of process pid: its state and, when it
// sleeps in the kernel, where ("state D, in nfs_wait_bit_killable"); ""
// where /proc cannot tell.
func procState(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	f, ok := machine.StatFields(b)
	if !ok || len(f) == 0 {
		return ""
	}
	s := "state " + f[0]
	if wc, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/wchan"); err == nil {
		if c := strings.TrimSpace(string(wc)); c != "" && c != "0" {
			s += ", in " + printable(c, 64)
		}
	}
	return s
}

// reap collects the exited workers (whose process groups the launcher
// has dealt with) and the rest of their output: Wait returns once the
// worker's pipes are drained, or WaitDelay after, unless a write of that
// output is stuck (a console that takes nothing, a log file on a hung
// mount): reap waits at most WaitDelay and reapBound, then warns of
// those whose output it left to finish in the background.
func (j *job) reap(workers []*worker) {
	// Together: each Wait may wait out its output's WaitDelay (a process
	// the worker left holds the pipe open), and one after another they
	// would add up.
	var wg sync.WaitGroup
	reaped := make([]chan struct{}, len(workers))
	var delay time.Duration
	for i, w := range workers {
		reaped[i] = make(chan struct{})
		delay = max(delay, w.cmd.WaitDelay)
		wg.Go(func() {
			defer close(reaped[i])
			j.guard.drop(w.cmd.Process.Pid) // before the reap frees the group's id
			var ee *exec.ExitError
			if err := w.cmd.Wait(); errors.Is(err, exec.ErrWaitDelay) {
				// Its groups and session are dealt with: what holds the
				// pipes is a process that left them (setsid).
				j.cfg.Warnf("node %d: rank %d (pid %d) has exited, but a process it started outside its session still holds its standard output or error open: slimerun stops reading it, and that process's writes there fail from now on (SIGPIPE, EPIPE; a process meant to outlive the job must send its output elsewhere: setsid prog >prog.log 2>&1 &)", j.cfg.NodeRank, w.rank, w.cmd.Process.Pid)
			} else if err != nil && !errors.As(err, &ee) {
				j.cfg.Logf("node %d: rank %d (pid %d): %v", j.cfg.NodeRank, w.rank, w.cmd.Process.Pid, err)
			}
			for _, p := range w.consoles {
				p.flush()
			}
			for _, f := range w.files {
				f.Close()
			}
		})
	}
	all := make(chan struct{})
	go func() { wg.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(delay + reapBound):
		for i, w := range workers {
			select {
			case <-reaped[i]:
			default:
				j.cfg.Warnf("node %d: rank %d (pid %d): its output is still being written %v after it exited (a console that takes nothing, a log file on a hung mount): left to finish in the background", j.cfg.NodeRank, w.rank, w.cmd.Process.Pid, delay+reapBound)
			}
		}
	}
}

// rootCause picks, among the failures seen before the launcher stopped
// anyone, the likeliest cause: a worker killed by a signal (which the
// others then noticed and exited over) before one that exited with an
// error, and among equals the first reported. Exits are reported in the
// order their waits return, which a loaded machine can shuffle by a few
// milliseconds, the time the survivors need to notice a lost peer.
// SIGABRT is no such signal: a survivor raises it itself when it notices
// a lost peer (a collective library's abort, a failed check), so it
// counts as an exit.
func rootCause(failures []error) error {
	for _, f := range failures {
		if we, ok := f.(*WorkerError); ok && we.ExitCode < 0 && we.Signal != syscall.SIGABRT {
			return f
		}
	}
	return failures[0]
}

func workerError(ex exit, attempt int) error {
	w, ws := ex.w, ex.status
	if ex.err != nil {
		return fmt.Errorf("launcher: rank %d: %w", w.rank, ex.err)
	}
	we := &WorkerError{Rank: w.rank, LocalRank: w.local, Attempt: attempt, ExitCode: -1, Pid: w.cmd.Process.Pid,
		Message: readErrorFile(w.errFile)}
	if ws.Signaled() {
		we.Signal = ws.Signal()
		return we
	}
	we.ExitCode = ws.ExitStatus()
	return we
}

func (j *job) startWorker(attempt, local int, con *console) (*worker, error) {
	cfg := j.cfg
	rank := cfg.NodeRank*cfg.NProcPerNode + local
	w := &worker{local: local, rank: rank}
	cmd := exec.Command(cfg.Program, cfg.Args...)
	if errors.Is(cmd.Err, exec.ErrDot) {
		// Found through "." (or an empty entry) in the user's PATH: run,
		// as execvp runs it, not refused as Go's LookPath would have it.
		cmd.Err = nil
	}
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
	set("ROLE_NAME", cmp.Or(cfg.Role, "default"))
	set("ROLE_RANK", itoa(rank))
	set("ROLE_WORLD_SIZE", itoa(world))
	set("MASTER_ADDR", j.workerAddr)
	set("MASTER_PORT", itoa(j.torchPort))
	set("TORCHELASTIC_RUN_ID", cfg.RunID)
	set("TORCHELASTIC_RESTART_COUNT", itoa(attempt))
	set("TORCHELASTIC_MAX_RESTARTS", itoa(cfg.MaxRestarts))
	// torch hosts its own store on MASTER_PORT; ours is on SLIME_STORE_PORT.
	set("TORCHELASTIC_USE_AGENT_STORE", "False")
	set("SLIME_RUN_ID", cfg.RunID)
	set("SLIME_RESTART_COUNT", itoa(attempt))
	set("SLIME_AGENT_STORE", "1")
	set("SLIME_STORE_PORT", itoa(cfg.MasterPort))
	if len(cfg.JobSecret) > 0 {
		set("SLIME_JOB_SECRET", string(cfg.JobSecret))
	}
	// Its own, also where the launcher's environment has one (a launch
	// within a torchrun worker): the workers must not write the outer
	// worker's. Where none could be made, none, not the outer one.
	if w.errFile = j.errorFile(attempt, local); w.errFile != "" {
		set("TORCHELASTIC_ERROR_FILE", w.errFile)
	} else {
		env = slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "TORCHELASTIC_ERROR_FILE=") })
	}
	// As torchrun: several workers of a node would each start a thread
	// per core; one worker keeps OpenMP's default.
	if _, ok := lookupEnv(cfg.Env, "OMP_NUM_THREADS"); !ok && cfg.NProcPerNode > 1 {
		set("OMP_NUM_THREADS", "1")
	}
	// As torchrun: a collective of torch's NCCL backend whose peer died
	// fails (its watchdog aborts the communicator) rather than hangs.
	// torch reads the first name up to 2.1, the second from 2.2.
	for _, k := range []string{"NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING"} {
		if _, ok := lookupEnv(cfg.Env, k); !ok {
			set(k, "1")
		}
	}
	cmd.Env = env
	if cfg.Stdin != nil { // a nil *os.File in cmd.Stdin would close descriptor 0
		cmd.Stdin = cfg.Stdin
	}
	// A session of its own, as torchrun's start_new_session: the worker
	// leads a process group of its own (its id the worker's pid), and,
	// having no controlling terminal, reads a terminal on its standard
	// input (pdb) without being stopped as a background group (SIGTTIN).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
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
				for _, f := range w.files { // the stream's before
					f.Close()
				}
				return nil, err
			}
			w.files = append(w.files, f)
			outs = append(outs, &logWriter{f: f, warnf: cfg.Warnf, what: "rank " + itoa(rank) + "'s " + s.name + " log"})
		}
		if (redir&s.bit == 0 || tee&s.bit != 0) && (cfg.ConsoleRanks == nil || slices.Contains(cfg.ConsoleRanks, local)) {
			pw := &prefixWriter{con: con, out: s.console, prefix: prefix, gone: j.consoleGone(s.name)}
			w.consoles = append(w.consoles, pw)
			outs = append(outs, pw)
		}
		*s.target = io.MultiWriter(outs...)
	}
	w.cmd = cmd
	start := cmd.Start
	if cfg.BindToCore {
		start = func() error { return startOn(cmd, cfg.cpuOf(j.cpuBase, local)) }
	}
	if err := start(); err != nil {
		for _, f := range w.files {
			f.Close()
		}
		return nil, startError(rank, missingInterpreter(cmd.Path, err))
	}
	return w, nil
}

// missingInterpreter adds to err, a failure to start path, what the
// kernel's ENOENT leaves out where path itself is there: the interpreter
// that its #! line names is missing.
func missingInterpreter(path string, err error) error {
	if !errors.Is(err, syscall.ENOENT) {
		return err
	}
	f, ferr := os.Open(path)
	if ferr != nil {
		return err
	}
	defer f.Close()
	head := make([]byte, 256) // the most of a #! line the kernel reads
	n, _ := io.ReadFull(f, head)
	line, ok := bytes.CutPrefix(head[:n], []byte("#!"))
	if !ok {
		return err
	}
	if i := bytes.IndexByte(line, '\n'); i >= 0 {
		line = line[:i]
	}
	interp := strings.Fields(string(line))
	if len(interp) == 0 {
		return err
	}
	if _, serr := os.Stat(interp[0]); serr == nil {
		return err
	}
	return fmt.Errorf("%w: the program is there, but its interpreter %q (its #! line) is not", err, interp[0])
}

// cpuOf is the CPU BindToCore gives local rank local of a node whose
// ranks start base ranks into the CPUs (see placement.go): they are dealt
// round.
func (c *Config) cpuOf(base, local int) int { return c.cpus[(base+local)%len(c.cpus)] }

func openLog(cfg *Config, attempt, local int, name string) (*os.File, error) {
	if cfg.LogDir == "" {
		d, err := os.MkdirTemp("", "slimerun-")
		if err != nil {
			return nil, err
		}
		cfg.LogDir = d
		// Said even where Logf is silent: the user named no directory,
		// and could not find this one otherwise.
		cfg.Warnf("no log directory given (--log-dir): logs in %s", d)
	}
	dir := filepath.Join(cfg.logRoot(cfg.LogDir), "attempt_"+strconv.Itoa(attempt), strconv.Itoa(local))
	if err := mkdirSecure(dir, 0o755); err != nil {
		return nil, fmt.Errorf("launcher: log dir: %w", err)
	}
	return os.Create(filepath.Join(dir, name+".log"))
}

// logRoot is this node's directory of the job under base (the log
// directory): base/RUN_ID on one node, base/RUN_ID/node_N across nodes,
// where the nodes may share base (a shared file system, or namespaces of
// one machine) and each must keep its own local ranks' logs and error
// files, as torchrun's agents each write under a directory of their own.
func (c *Config) logRoot(base string) string {
	if c.NNodes > 1 {
		return filepath.Join(base, c.RunID, "node_"+strconv.Itoa(c.NodeRank))
	}
	return filepath.Join(base, c.RunID)
}

func dirExists(d string) bool {
	fi, err := os.Stat(d)
	return err == nil && fi.IsDir()
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

// logWriter writes a worker's output to its log file. A write that fails
// (the disk is full) is reported once, and it and the rest are dropped:
// an error would stop the copy of the worker's output, and the worker's
// next write would kill it (SIGPIPE), the console's copy stopping with it.
type logWriter struct {
	f      *os.File
	warnf  func(format string, args ...any)
	what   string
	failed bool
}

func (l *logWriter) Write(b []byte) (int, error) {
	if l.failed {
		return len(b), nil
	}
	if _, err := l.f.Write(b); err != nil {
		l.failed = true
		l.warnf("writing %s: %v; the rest of it is not in the log", l.what, err)
	}
	return len(b), nil
}

// consoleGone returns what a console writer of stream name ("stdout",
// "stderr") calls when its writes fail: the first failure of each
// stream in the job is said once, on standard error (where stdout is
// piped into a reader that ended, stderr is usually still the terminal).
// The workers go on and their console output is dropped, not held
// back: a worker blocked on its output would hang the job.
func (j *job) consoleGone(name string) func(error) {
	once := j.consoleOnce(name)
	return func(err error) {
		once.Do(func() {
			stream := map[string]string{"stdout": "output", "stderr": "error"}[name]
			j.cfg.Warnf("the console's standard %s is gone (%v): the workers' %s is dropped from now on (their log files, with --redirects or --tee, still get it)", stream, err, name)
		})
	}
}

// consoleOnce is the job's sync.Once for console stream name.
func (j *job) consoleOnce(name string) *sync.Once {
	if name == "stdout" {
		return &j.outGone
	}
	return &j.errGone
}

// console is what the prefixWriters of an attempt share: the lock that
// keeps their lines whole, and which of them, if any, left a line
// unfinished on its output (a prompt shown before its newline).
type console struct {
	mu   sync.Mutex
	open *prefixWriter
}

// partialDelay is how long a partial line waits for its end before it is
// shown as it is: a prompt (pdb's "(Pdb) ", input()) ends in no newline,
// and the user must see it before typing.
const partialDelay = 100 * time.Millisecond

// prefixWriter writes lines to out, each behind prefix. A partial line
// waits for its end, for partialDelay (but a progress bar's update, after
// a '\r', waits for its end), or for flush once the worker has exited;
// shown unfinished, it is continued without a second prefix unless
// another writer's line came in between (which first ends it with a
// newline).
type prefixWriter struct {
	con    *console
	out    io.Writer
	prefix string
	buf    []byte
	timer  *time.Timer // shows the partial line in buf; nil until one waits
	// gen counts the timers armed: a timer shows the partial line only
	// if it is still the latest (one stopped too late, its line ended,
	// must not show the next line's start before that has waited).
	gen uint64
	// afterCR says the last line ended at a lone '\r': the partial line
	// is a progress bar's next update, shown when it ends (at its '\r'),
	// as before, not by the timer (between two ranks' bars, each shown
	// update would be ended by a newline, and the console scroll).
	afterCR bool
	// gone, if set, is called when a write to out fails (the console's
	// reader has gone: slimerun ... | head); dead then says the output is
	// dropped.
	gone func(error)
	dead bool
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.con.mu.Lock()
	defer p.con.mu.Unlock()
	if p.dead {
		return len(b), nil
	}
	p.buf = append(p.buf, b...)
	ended := false // a line ended: a partial line left is a new one
	for {
		// A line ends at '\n', or at a '\r' that rewrites it in place
		// (a progress bar's update, which may not see '\n' for an epoch);
		// "\r\n" is one end.
		i := -1
	scan:
		for j, c := range p.buf {
			switch {
			case c == '\n':
				i = j
				break scan
			case c == '\r' && j+1 == len(p.buf):
				break scan // "\r\n", maybe: wait for the next byte
			case c == '\r' && p.buf[j+1] == '\n':
				i = j + 1
				break scan
			case c == '\r':
				i = j
				break scan
			}
		}
		if i < 0 {
			break
		}
		if i == 0 && p.buf[0] == '\r' {
			// Nothing of this line shown, nothing to rewrite: the prefix
			// starts the update. Where its start is shown, back to it.
			if p.con.open == p && !p.emit([]byte{'\r'}, true) {
				return len(b), nil
			}
			p.buf = p.buf[1:]
			p.afterCR = true
			ended = true
			continue
		}
		if !p.emit(p.buf[:i+1], true) {
			return len(b), nil // a broken console must not stop the worker
		}
		p.afterCR = p.buf[i] == '\r'
		p.buf = p.buf[i+1:]
		ended = true
	}
	if len(p.buf) > 64<<10 { // an endless line: emit what we have
		if !p.emit(append(p.buf, '\n'), true) {
			return len(b), nil
		}
		p.buf = p.buf[:0]
		ended = true
	}
	// The timer times the partial line now in buf: where the one it was
	// armed for has ended, this one has waited for nothing yet.
	if ended && p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	if len(p.buf) > 0 && p.timer == nil && !p.afterCR {
		p.gen++
		gen := p.gen
		p.timer = time.AfterFunc(partialDelay, func() { p.showPartial(gen) })
	}
	return len(b), nil
}

// showPartial shows the partial line that has waited partialDelay, but a
// '\r' at its end (the start of "\r\n", maybe), where gen is still the
// latest timer's (see Write).
func (p *prefixWriter) showPartial(gen uint64) {
	p.con.mu.Lock()
	defer p.con.mu.Unlock()
	if gen != p.gen {
		return // stopped too late: a later line's timer times it
	}
	p.timer = nil
	if p.afterCR || p.dead { // a progress bar's update since, or no console
		return
	}
	n := len(p.buf)
	if n > 0 && p.buf[n-1] == '\r' {
		n--
	}
	if n > 0 && p.emit(p.buf[:n], false) {
		p.buf = p.buf[n:]
	}
}

// emit writes line to p.out, behind the prefix unless it continues p's
// unfinished line, after ending another writer's unfinished line; whole
// says that line ends p's (p.con.mu is held). It reports false where out
// failed.
func (p *prefixWriter) emit(line []byte, whole bool) bool {
	head := p.prefix
	if o := p.con.open; o == p {
		head = ""
	} else if o != nil {
		io.WriteString(o.out, "\n")
	}
	p.con.open = nil
	if !whole {
		p.con.open = p
	}
	if _, err := io.WriteString(p.out, head+string(line)); err != nil {
		p.con.open = nil
		p.dead, p.buf = true, nil // dropped from now on, not gathered
		if p.gone != nil {
			p.gone(err)
		}
		return false
	}
	return true
}

// flush ends what is pending once the worker has exited: its partial
// line, shown or not, ends with a newline.
func (p *prefixWriter) flush() {
	p.con.mu.Lock()
	defer p.con.mu.Unlock()
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	if len(p.buf) > 0 || p.con.open == p {
		p.emit(append(p.buf, '\n'), true)
		p.buf = p.buf[:0]
	}
}

// sweepOrphans removes the shared-memory segments whose creators are gone
// (shm.SweepOrphans): what jobs killed before they could clean up, their
// launchers included, left in /dev/shm.
func sweepOrphans(cfg *Config) {
	removed, err := shm.SweepOrphans()
	if len(removed) > 0 {
		cfg.Logf("removed %d shared-memory segment(s) that killed jobs left: %v", len(removed), removed)
	}
	if err != nil {
		cfg.Logf("sweeping orphaned shared memory: %v", err)
	}
}

// refusedWarning tells the user, through warnf, of a connection the job's
// store refused (another job's, or one given another SLIME_JOB_SECRET: a
// node started without the same secret waits for nothing otherwise), at
// most once a second; those refused meanwhile are told at the second's
// end, counted, with the last one's address.
// countRefused is warn, counting the refusals in j.refused.
func (j *job) countRefused(warn func(remote string, err error)) func(remote string, err error) {
	return func(remote string, err error) {
		j.refused.Add(1)
		warn(remote, err)
	}
}

func refusedWarning(warnf func(string, ...any)) func(remote string, err error) {
	var mu sync.Mutex
	var last time.Time
	var unsaid int
	var lastAddr string
	var flush *time.Timer
	say := func(remote string, n int, err error) {
		what := "a connection from " + remote
		if n > 1 {
			what = fmt.Sprintf("%d more connections, the last from %s,", n, remote)
		}
		if errors.Is(err, auth.ErrNotUser) {
			warnf("the rendezvous store refused %s: another user's process (the job has no secret): %v", what, err)
			return
		}
		warnf("the rendezvous store refused %s: not this job's (another SLIME_JOB_SECRET or run id? it must be the same on every node): %v", what, err)
	}
	var lastErr error
	return func(remote string, err error) {
		mu.Lock()
		defer mu.Unlock()
		if wait := time.Second - time.Since(last); wait > 0 {
			unsaid, lastAddr, lastErr = unsaid+1, remote, err
			if flush == nil {
				flush = time.AfterFunc(wait, func() {
					mu.Lock()
					defer mu.Unlock()
					if unsaid > 0 {
						say(lastAddr, unsaid, lastErr)
						last, unsaid = time.Now(), 0
					}
					flush = nil
				})
			}
			return
		}
		last = time.Now()
		say(remote, 1, err)
	}
}
