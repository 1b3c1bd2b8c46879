package collective

import (
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/auth"
	"github.com/slimego/slimego/internal/bytesize"
	"github.com/slimego/slimego/internal/fault"
)

// DefaultPort is the master port when neither the options nor the
// environment give one (torchrun's default).
const DefaultPort = 29500

// Options configure [Init]. Zero fields are filled from the environment
// ([LoadEnv]); fields already set win over it. The knobs are grouped by
// concern: [Job] (where this rank stands and how it meets the others),
// [Shm] (the shared-memory engine within a node), [TCP] (across nodes) and
// [CUDA] (the GPU backend); each group is embedded, so that o.Rank or
// o.Channels name its fields directly. Job's fields come from the
// launcher's variables, every other knob from its SLIME_* variable.
type Options struct {
	Job
	// Timeout bounds every wait (SLIME_TIMEOUT; default 5 minutes);
	// within a node, a call's waits together end Timeout after its
	// first.
	Timeout time.Duration
	// Backend is cpu, cuda or auto (SLIME_BACKEND).
	Backend device.Kind
	// Debug is "", "INFO" or "TRACE" (SLIME_DEBUG): what Init logs to
	// stderr.
	Debug string
	Shm
	TCP
	CUDA
}

// Job is where this rank stands in the job and how it meets the other
// ranks.
type Job struct {
	// Rank and WorldSize: this rank and the number of ranks. WorldSize 0
	// means "from the environment".
	Rank, WorldSize int
	// LocalRank and LocalWorldSize: the rank on this node and the number
	// of ranks on each node.
	LocalRank, LocalWorldSize int
	// NodeRank is this node's index (GROUP_RANK). Init needs only that
	// it tells the nodes apart (under mpirun, LoadEnv gives the node's
	// first rank): Communicator.NodeRank is the node's place among the
	// job's nodes, in [0, Nodes()).
	NodeRank int
	// MasterAddr and MasterPort locate the rendezvous store.
	MasterAddr string
	MasterPort int
	// AgentStore says a launcher (slimerun) hosts the store; otherwise
	// rank 0 hosts it.
	AgentStore bool
	// RunID names the job in store keys and shared-memory names, and binds
	// every connection of the job (see JobSecret).
	RunID string
	// JobID is the job every connection proves it belongs to, with
	// JobSecret: the launcher's run id (SLIME_RUN_ID, TORCHELASTIC_RUN_ID,
	// Slurm's or OpenMPI's job id). Empty: from the environment when the
	// store is the environment's (MasterPort zero), else RunID. A program
	// may name its communicators' keys (RunID) as it likes and still join
	// its launcher's store.
	JobID string
	// Attempt counts the launcher's restarts of the job's workers
	// (SLIME_RESTART_COUNT, TORCHELASTIC_RESTART_COUNT): each attempt has
	// store keys and shared-memory names of its own.
	Attempt int
	// JobSecret is what every connection to the store and between ranks
	// proves it holds (SLIME_JOB_SECRET, or the file SLIME_JOB_SECRET_FILE
	// names). slimerun makes one for a standalone job; across nodes every
	// node must be given the same. Without one a job across nodes runs but
	// warns: anyone who reaches the store's port can join it.
	JobSecret []byte
	// Name tells apart several communicators of one job (default "world").
	Name string
}

// Shm tunes the shared-memory engine that gathers within a node.
type Shm struct {
	// SpinTime is how long a shared-memory wait polls before it sleeps
	// (SLIME_SPIN, a Go duration; default by ranks per core).
	SpinTime time.Duration
	// SlotBytes, Slots, ZeroCopyMin, CMAMin and BigCopy tune the
	// shared-memory protocol (SLIME_SLOT_BYTES, SLIME_SLOTS,
	// SLIME_ZERO_COPY_MIN, SLIME_CMA_MIN, SLIME_BIG_COPY; a negative CMAMin
	// turns cross-memory attach off).
	SlotBytes, Slots, ZeroCopyMin, CMAMin, BigCopy int
}

// TCP chooses how data moves across nodes.
type TCP struct {
	// Algo is the algorithm across nodes (SLIME_ALGO): "hier" (rail-aligned
	// hierarchical; needs the same number of ranks on every node, laid out
	// node by node), "ring" (a flat ring over TCP, any layout) or "auto"
	// (the default: hier where the layout allows it, ring elsewhere).
	// A communicator's Options report the algorithm it chose ("intra" on
	// one node), which Init takes back (intra as auto).
	Algo string
	// SocketIfName names the network interface for inter-node traffic
	// (SLIME_SOCKET_IFNAME; default: the one that reaches MASTER_ADDR).
	SocketIfName string
	// Channels is the number of TCP connections per peer pair
	// (SLIME_CHANNELS).
	Channels int
	// RcvLowat bounds how many bytes a TCP receive waits for before its
	// reader wakes (SLIME_RCVLOWAT; default 4M; negative, or "off": woken
	// per segment).
	RcvLowat int
	// SendCopyMin is the least block, across nodes with one rank per node
	// or on the ring, whose out-of-place copy into the own place rides
	// with its first send, chunk by chunk while the chunk is in the cache
	// (SLIME_SEND_COPY_MIN; default 32M; negative: never).
	SendCopyMin int
}

// MaxGPUBlocks is the most thread blocks CUDA.GPUBlocks may ask for: a
// launch takes at most one per 64 KiB of its block, 256 with the default
// scratch.
const MaxGPUBlocks = 256

// CUDA tunes the GPU backend.
type CUDA struct {
	// Eager launches GPU work directly instead of capturing it into CUDA
	// graphs (SLIME_EAGER=1; the commands' --eager-mode).
	Eager bool
	// GPUScratch is the bytes of one block in the GPU all-gather's scratch
	// slots (SLIME_GPU_SCRATCH; default 16 MiB): each rank holds 2 × local
	// ranks × GPUScratch of device memory, and larger blocks go in rounds.
	GPUScratch int
	// GPUBlocks bounds the thread blocks of one all-gather kernel launch
	// on each rank (SLIME_GPU_BLOCKS; default 16, at most MaxGPUBlocks).
	// The kernels of a node's ranks wait for each other, so all of them
	// must be resident on their GPUs at once: ranks that share one GPU
	// share its multiprocessors (a block is 512 threads, and a
	// multiprocessor holds at most 2048), and a count past that waits
	// until the timeout.
	GPUBlocks int
}

// LoadEnv reads the environment that slimerun and torchrun (RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
// MASTER_PORT), Slurm's srun and OpenMPI's mpirun set, in that order of
// preference, plus the SLIME_* knobs. getenv is os.Getenv in practice;
// tests pass a map.
//
// The launcher is the one that gives the world size: WORLD_SIZE (torchrun,
// slimerun), OMPI_COMM_WORLD_SIZE (mpirun) or SLURM_NTASKS (srun). Where
// torchrun's variables are unset, that launcher's own fill in, and never
// another's: under mpirun inside a Slurm allocation the SLURM_* variables
// describe mpirun's daemons, not the ranks. A WORLD_SIZE exported for the
// whole job with no RANK (a batch script's, the rank left to the
// launcher) is read as that launcher's world size: its variables give
// the rest.
//
//   - srun: SLURM_PROCID is the rank, SLURM_LOCALID the local rank,
//     SLURM_NODEID the node rank, and this node's count in
//     SLURM_STEP_TASKS_PER_NODE (or SLURM_TASKS_PER_NODE; Slurm's
//     compressed form "2(x2),1") the local world size, so uneven layouts
//     run. The counts must add up to SLURM_NTASKS and number
//     SLURM_STEP_NUM_NODES and SLURM_NNODES where those are set (no more
//     than SLURM_JOB_NUM_NODES, the allocation's, which a step may use
//     part of). SLURM_NTASKS_PER_NODE is read only where neither
//     tasks-per-node list is set: it is the allocation's request, which a
//     step may not follow. The run id is "slurm<SLURM_JOB_ID>.<SLURM_STEP_ID>".
//   - mpirun: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK and _LOCAL_SIZE.
//     OpenMPI does not give the node's index: the node rank is the rank
//     of the node's first rank (rank − local rank), which tells the nodes
//     apart, whatever their sizes, under the by-slot mapping mpirun uses
//     by default (a hostfile's or --host's uneven slots, "a:1,b:2",
//     included); Init numbers the nodes from it (Communicator.NodeRank).
//     A mapping that interleaves the nodes (--map-by node, several ranks
//     a node) is refused at Init: the ranks' local ranks and sizes do not
//     add up. The run id is "ompi<job id>", from OMPI_MCA_ess_base_jobid
//     (OpenMPI 4) or PMIX_NAMESPACE (OpenMPI 5). With no SLIME_JOB_SECRET,
//     the job secret is OMPI_MCA_orte_precondition_transports: mpirun
//     hands every process of one job the same random 128-bit value (made
//     for its transports' own keys), which other users cannot read
//     (/proc/PID/environ is the owner's), so the job's ranks prove
//     membership to each other with no setup, and another job on the
//     host cannot join. OpenMPI 5's mpirun sets no such value (its
//     processes derive one from the job id inside MPI_Init, which a
//     slimego program does not call): its jobs have no secret unless
//     SLIME_JOB_SECRET is given.
//   - MPICH's and Intel MPI's mpiexec (Hydra): PMI_RANK and PMI_SIZE,
//     MPI_LOCALRANKID and MPI_LOCALNRANKS; the node rank as mpirun's. Read
//     after Slurm's (srun --mpi=pmi2 sets PMI_RANK and PMI_SIZE as well),
//     but before them where MPI_LOCALRANKID, Hydra's own, is set: inside
//     an sbatch script every rank has the batch step's SLURM_PROCID=0.
//
// Where the launcher says that every rank runs on one host (a local world
// size equal to the world size, OMPI_MCA_orte_num_nodes=1, SLURM_NNODES=1
// or one count in SLURM_TASKS_PER_NODE), MASTER_ADDR defaults to
// 127.0.0.1. Where MASTER_PORT is unset under srun or mpirun, the store's
// port is derived from the run id, in [20000, 30000) (below Linux's
// ephemeral range, 32768-60999, where the kernel picks the ports of
// outgoing connections), so that concurrent jobs on one host do not meet
// at torchrun's default 29500; elsewhere it is 29500.
func LoadEnv(getenv func(string) string) (Options, error) {
	var o Options
	// rankVar names the variable that gave o.Rank once it is read: an
	// error names the rank, since a launcher's tasks (srun without -l,
	// mpirun) often print to one stream.
	var rankVar string
	bad := func(format string, a ...any) (Options, error) {
		who := "environment"
		if rankVar != "" {
			who = fmt.Sprintf("environment of rank %d (%s)", o.Rank, rankVar)
		}
		return o, fmt.Errorf("collective: %s: %w: "+format, append([]any{who, fault.ErrInvalid}, a...)...)
	}
	num := func(name string) (int, bool, error) {
		v := strings.TrimSpace(getenv(name))
		if v == "" {
			return 0, false, nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return 0, true, fmt.Errorf("%s=%q is not a non-negative integer", name, v)
		}
		return n, true, nil
	}
	// first returns the first variable of names that is set.
	first := func(names ...string) (int, string, error) {
		for _, n := range names {
			v, ok, err := num(n)
			if err != nil || ok {
				return v, n, err
			}
		}
		return 0, "", nil
	}
	var err error
	var sizeVar string
	// PMI_RANK and PMI_SIZE come after Slurm's (srun --mpi=pmi2 sets them
	// too), except under Hydra's mpiexec, which sets MPI_LOCALRANKID (srun
	// does not): inside an sbatch script every rank inherits the batch
	// step's SLURM_PROCID=0 and SLURM_NTASKS.
	slurmRank, pmiRank, slurmSize, pmiSize := "SLURM_PROCID", "PMI_RANK", "SLURM_NTASKS", "PMI_SIZE"
	if strings.TrimSpace(getenv("MPI_LOCALRANKID")) != "" {
		slurmRank, pmiRank, slurmSize, pmiSize = pmiRank, slurmRank, pmiSize, slurmSize
	}
	rank, rv, err := first("RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", slurmRank, pmiRank)
	if err != nil {
		return bad("%v", err)
	}
	o.Rank, rankVar = rank, rv
	if o.WorldSize, sizeVar, err = first("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", slurmSize, pmiSize); err != nil {
		return bad("%v", err)
	}
	if sizeVar == "" && o.Rank > 0 {
		// A rank of a larger world whose size did not reach it: as a
		// world of one it would run as rank 0, alone and unaware.
		return bad("%s=%d is set but no world size variable (WORLD_SIZE, OMPI_COMM_WORLD_SIZE, SLURM_NTASKS, PMI_SIZE)", rankVar, o.Rank)
	}
	if sizeVar == "" {
		// Not launched by anything (or a rank 0 alone, as in a Slurm
		// batch script outside srun): a world of one.
		o.WorldSize, o.Rank = 1, 0
	} else if rankVar == "" {
		return bad("%s=%d is set but no rank variable (RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID, PMI_RANK)", sizeVar, o.WorldSize)
	}
	if o.WorldSize == 0 {
		return bad("%s=0", sizeVar)
	}
	if o.Rank >= o.WorldSize {
		return bad("%s=%d is not below %s=%d", rankVar, o.Rank, sizeVar, o.WorldSize)
	}
	launcher := sizeVar
	if sizeVar == "WORLD_SIZE" && rankVar != "RANK" {
		// WORLD_SIZE exported for the job (a batch script's, before srun
		// or mpirun), the rank left to the launcher: the launcher's
		// variables give the rest of the layout, or ranks of several
		// nodes take themselves for one.
		for _, v := range []string{"OMPI_COMM_WORLD_SIZE", slurmSize, pmiSize} {
			if strings.TrimSpace(getenv(v)) != "" {
				launcher = v
				break
			}
		}
	}
	ompi, slurm, hydra := launcher == "OMPI_COMM_WORLD_SIZE", launcher == "SLURM_NTASKS", launcher == "PMI_SIZE"
	// own lists torchrun's variable, then the launcher's own.
	own := func(torch, mpi, srun, hyd string) []string {
		switch {
		case ompi && mpi != "":
			return []string{torch, mpi}
		case slurm && srun != "":
			return []string{torch, srun}
		case hydra && hyd != "":
			return []string{torch, hyd}
		}
		return []string{torch}
	}
	var localVar string
	if o.LocalRank, localVar, err = first(own("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID")...); err != nil {
		return bad("%v", err)
	}
	nodeRank, nodeVar, err := first(own("GROUP_RANK", "", "SLURM_NODEID", "")...)
	if err != nil {
		return bad("%v", err)
	}
	var lwsVar string
	if o.LocalWorldSize, lwsVar, err = first(own("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "", "MPI_LOCALNRANKS")...); err != nil {
		return bad("%v", err)
	}
	oneHost := false // the launcher says every rank runs on this host
	if lwsVar == "" && slurm {
		lws, nodes, err := slurmLocalSize(getenv, o.WorldSize, nodeRank, nodeVar != "")
		if err != nil {
			return bad("%v", err)
		}
		o.LocalWorldSize = lws
		if lws > 0 {
			lwsVar = "SLURM_TASKS_PER_NODE"
			oneHost = nodes == 1
		}
	}
	if lwsVar == "" && slurm && localVar == "SLURM_LOCALID" {
		return bad("SLURM_LOCALID is set but not how many tasks run on each node (SLURM_TASKS_PER_NODE, SLURM_NTASKS_PER_NODE)")
	}
	if lwsVar == "" {
		o.LocalWorldSize = o.WorldSize // one node
		o.LocalRank = o.Rank
	} else if o.LocalWorldSize == o.WorldSize {
		oneHost = true
	}
	if ompi && strings.TrimSpace(getenv("OMPI_MCA_orte_num_nodes")) == "1" {
		oneHost = true
	}
	if o.LocalWorldSize == 0 || o.LocalRank >= o.LocalWorldSize {
		return bad("local rank %d of local world size %d", o.LocalRank, o.LocalWorldSize)
	}
	if nodeVar == "" {
		// The node's first rank, where the launcher numbers the ranks
		// node by node: unlike rank / local size, right for nodes of
		// different sizes too.
		if o.LocalRank > o.Rank {
			return bad("local rank %d is above rank %d, and no variable names the node", o.LocalRank, o.Rank)
		}
		nodeRank = o.Rank - o.LocalRank
	}
	// Nodes may differ in size (Slurm's uneven task counts): Init learns
	// the whole layout from the ranks themselves.
	o.NodeRank = nodeRank
	o.MasterAddr = strings.TrimSpace(getenv("MASTER_ADDR"))
	if o.MasterAddr == "" && oneHost {
		o.MasterAddr = "127.0.0.1"
	}
	if o.MasterAddr == "" && o.WorldSize > 1 {
		return bad("MASTER_ADDR is not set (the host of rank 0, or of the launcher's store)")
	}
	// jobID names the launcher's job: what tells concurrent jobs apart.
	jobID := ""
	switch {
	case ompi:
		if id := sanitizeID(firstNonEmpty(strings.TrimSpace(getenv("OMPI_MCA_ess_base_jobid")), strings.TrimSpace(getenv("PMIX_NAMESPACE")))); id != "" {
			jobID = "ompi" + id
		}
	case slurm:
		if id := sanitizeID(firstNonEmpty(strings.TrimSpace(getenv("SLURM_JOB_ID")), strings.TrimSpace(getenv("SLURM_JOBID")))); id != "" {
			jobID = "slurm" + id
			if step := sanitizeID(firstNonEmpty(strings.TrimSpace(getenv("SLURM_STEP_ID")), strings.TrimSpace(getenv("SLURM_STEPID")))); step != "" {
				jobID += "." + step
			}
		}
	}
	port, ok, err := num("MASTER_PORT")
	if err != nil {
		return bad("%v", err)
	}
	if !ok {
		port = DefaultPort
		if jobID != "" {
			port = derivedPort(jobID)
		}
	}
	if port == 0 || port > 65535 {
		return bad("MASTER_PORT=%d is not a TCP port", port)
	}
	o.MasterPort = port
	o.AgentStore = getenv("SLIME_AGENT_STORE") == "1"
	if !o.AgentStore && strings.EqualFold(getenv("TORCHELASTIC_USE_AGENT_STORE"), "true") {
		// torchrun's own store holds MASTER_PORT: rank 0 hosts ours beside it.
		o.MasterPort++
	}
	if p, ok, err := num("SLIME_STORE_PORT"); err != nil {
		return bad("%v", err)
	} else if ok {
		o.MasterPort = p
	}
	o.RunID = firstNonEmpty(getenv("SLIME_RUN_ID"), getenv("TORCHELASTIC_RUN_ID"), jobID, "port"+strconv.Itoa(o.MasterPort))
	o.JobID = o.RunID
	if rc := strings.TrimSpace(firstNonEmpty(getenv("SLIME_RESTART_COUNT"), getenv("TORCHELASTIC_RESTART_COUNT"))); rc != "" {
		n, err := strconv.Atoi(rc)
		if err != nil || n < 0 {
			return bad("restart count %q is not a non-negative integer", rc)
		}
		o.Attempt = n
	}
	if v := getenv("SLIME_JOB_SECRET"); v != "" {
		o.JobSecret = []byte(v)
	} else if f := strings.TrimSpace(getenv("SLIME_JOB_SECRET_FILE")); f != "" {
		b, err := auth.ReadSecretFile(f)
		if err != nil {
			return bad("SLIME_JOB_SECRET_FILE: %v", err)
		}
		o.JobSecret = b
	} else if ompi {
		o.JobSecret = ompiSecret(getenv("OMPI_MCA_orte_precondition_transports"))
	}
	if t := strings.TrimSpace(getenv("SLIME_TIMEOUT")); t != "" {
		d, err := parseDuration(t)
		if err != nil {
			return bad("SLIME_TIMEOUT=%q: %v", t, err)
		}
		o.Timeout = d
	}
	if o.Backend, err = device.Parse(getenv("SLIME_BACKEND")); err != nil {
		return bad("SLIME_BACKEND: %v", err)
	}
	if v := strings.TrimSpace(getenv("SLIME_EAGER")); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return bad("SLIME_EAGER=%q: want 0 or 1", v)
		}
		o.Eager = b
	}
	if v := getenv("SLIME_GPU_SCRATCH"); v != "" {
		n, err := bytesize.Parse(v)
		if err != nil || n <= 0 {
			return bad("SLIME_GPU_SCRATCH=%q: want a positive size", v)
		}
		o.GPUScratch = int(n)
	}
	if v := strings.TrimSpace(getenv("SLIME_GPU_BLOCKS")); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 || n > MaxGPUBlocks {
			return bad("SLIME_GPU_BLOCKS=%q: want 1 to %d", v, MaxGPUBlocks)
		}
		o.GPUBlocks = n
	}
	o.Debug = strings.ToUpper(strings.TrimSpace(getenv("SLIME_DEBUG")))
	o.Algo = strings.ToLower(strings.TrimSpace(getenv("SLIME_ALGO")))
	if o.Algo != "" && !ValidAlgo(o.Algo) {
		return bad("SLIME_ALGO=%q: want auto, hier or ring", o.Algo)
	}
	o.SocketIfName = strings.TrimSpace(getenv("SLIME_SOCKET_IFNAME"))
	if v := strings.TrimSpace(getenv("SLIME_SPIN")); v != "" {
		d, err := parseNonNegDuration(v)
		if err != nil {
			return bad("SLIME_SPIN=%q: %v", v, err)
		}
		o.SpinTime = d
	}
	if v := strings.TrimSpace(getenv("SLIME_RCVLOWAT")); v != "" {
		if v == "off" || strings.HasPrefix(v, "-") || v == "0" {
			o.RcvLowat = -1
		} else if n, err := bytesize.Parse(v); err != nil {
			return bad("SLIME_RCVLOWAT=%q: %v", v, err)
		} else {
			o.RcvLowat = int(n)
		}
	}
	if v, ok, err := num("SLIME_CHANNELS"); err != nil {
		return bad("%v", err)
	} else if ok {
		if v < 1 || v > 64 {
			return bad("SLIME_CHANNELS=%d: want 1 to 64", v)
		}
		o.Channels = v
	}
	for _, k := range []struct {
		name string
		dst  *int
	}{{"SLIME_SLOT_BYTES", &o.SlotBytes}, {"SLIME_SLOTS", &o.Slots}, {"SLIME_ZERO_COPY_MIN", &o.ZeroCopyMin}, {"SLIME_CMA_MIN", &o.CMAMin}, {"SLIME_BIG_COPY", &o.BigCopy}, {"SLIME_SEND_COPY_MIN", &o.SendCopyMin}} {
		if v := getenv(k.name); v != "" {
			if (k.dst == &o.CMAMin || k.dst == &o.SendCopyMin) && strings.HasPrefix(strings.TrimSpace(v), "-") {
				*k.dst = -1 // off
				continue
			}
			n, err := bytesize.Parse(v)
			if err != nil {
				return bad("%s=%q: %v", k.name, v, err)
			}
			if n == 0 && (k.dst == &o.Slots || k.dst == &o.SlotBytes) {
				// Options' zero is the default; said in the environment,
				// a ring of no slots is a mistake, not a wish for 4.
				return bad("%s=%q: want 1 or more (leave it unset for the default)", k.name, v)
			}
			*k.dst = int(n)
		}
	}
	return o, nil
}

// ValidAlgo reports whether name is an algorithm across nodes that
// Options.Algo (SLIME_ALGO) takes: auto, hier or ring.
func ValidAlgo(name string) bool { return name == "auto" || name == "hier" || name == "ring" }

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// parseDuration accepts Go durations ("90s", "2m") and plain seconds
// ("30", "2.5"), and refuses zero, negative, NaN and overflowing values: a
// timeout of none would make every wait fail at once, reported as the
// peer's fault.
func parseDuration(s string) (time.Duration, error) {
	d, err := parseNonNegDuration(s)
	if err == nil && d == 0 {
		err = fmt.Errorf("not positive")
	}
	return d, err
}

// parseNonNegDuration is parseDuration that also takes zero (a knob's
// "default").
func parseNonNegDuration(s string) (time.Duration, error) {
	if n, err := strconv.ParseFloat(s, 64); err == nil {
		switch {
		case n != n || n < 0: // NaN or negative
			return 0, fmt.Errorf("not positive")
		case n*float64(time.Second) >= math.MaxInt64:
			return 0, fmt.Errorf("too long")
		}
		return time.Duration(n * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(s)
	if err == nil && d < 0 {
		err = fmt.Errorf("not positive")
	}
	return d, err
}

// maxSlurmNodes bounds the expansion of a tasks-per-node list, and
// maxSlurmTasks each node's count: an allocation beyond these is a typo or
// an attack, and its expansion must not exhaust memory.
const (
	maxSlurmNodes = 1 << 16
	maxSlurmTasks = 1 << 16
)

// parseTasksPerNode expands Slurm's compressed tasks-per-node list
// (SLURM_TASKS_PER_NODE): comma-separated positive counts, each optionally
// followed by "(xN)", N ≥ 1, for N nodes with that count; "3,2(x3),1" is
// [3 2 2 2 1]. Anything else (spaces, signs, empty items, zero counts,
// more than maxSlurmNodes nodes) is an error.
func parseTasksPerNode(s string) ([]int, error) {
	if s == "" {
		return nil, fmt.Errorf("empty")
	}
	var counts []int
	for _, item := range strings.Split(s, ",") {
		count, rep := item, "1"
		if i := strings.IndexByte(item, '('); i >= 0 {
			if !strings.HasPrefix(item[i:], "(x") || !strings.HasSuffix(item, ")") {
				return nil, fmt.Errorf("%q is not COUNT or COUNT(xNODES)", item)
			}
			count, rep = item[:i], item[i+2:len(item)-1]
		}
		c, err := positive(count, maxSlurmTasks)
		if err != nil {
			return nil, fmt.Errorf("%q: count %v", item, err)
		}
		n, err := positive(rep, maxSlurmNodes)
		if err != nil {
			return nil, fmt.Errorf("%q: repeat %v", item, err)
		}
		if len(counts)+n > maxSlurmNodes {
			return nil, fmt.Errorf("more than %d nodes", maxSlurmNodes)
		}
		for range n {
			counts = append(counts, c)
		}
	}
	return counts, nil
}

// positive parses a decimal in [1, max], digits only.
func positive(s string, max int) (int, error) {
	if s == "" || len(s) > 9 {
		return 0, fmt.Errorf("%q is not an integer in [1, %d]", s, max)
	}
	n := 0
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%q is not an integer in [1, %d]", s, max)
		}
		n = n*10 + int(c-'0')
	}
	if n < 1 || n > max {
		return 0, fmt.Errorf("%q is not an integer in [1, %d]", s, max)
	}
	return n, nil
}

// slurmLocalSize reads how many tasks of the step run on this node (node
// nodeRank, from SLURM_NODEID where haveNode) and on how many nodes (0
// when only SLURM_NTASKS_PER_NODE is known), cross-checked against the
// step's other variables. It returns 0, 0 where Slurm says nothing of it.
func slurmLocalSize(getenv func(string) string, worldSize, nodeRank int, haveNode bool) (lws, nodes int, err error) {
	name := "SLURM_STEP_TASKS_PER_NODE"
	list := strings.TrimSpace(getenv(name))
	if list == "" {
		name = "SLURM_TASKS_PER_NODE"
		list = strings.TrimSpace(getenv(name))
	}
	if list == "" {
		v := strings.TrimSpace(getenv("SLURM_NTASKS_PER_NODE"))
		if v == "" {
			return 0, 0, nil
		}
		n, err := positive(v, maxSlurmTasks)
		if err != nil {
			return 0, 0, fmt.Errorf("SLURM_NTASKS_PER_NODE: %v", err)
		}
		return n, 0, nil
	}
	counts, err := parseTasksPerNode(list)
	if err != nil {
		return 0, 0, fmt.Errorf("%s=%q: %v", name, list, err)
	}
	sum := 0
	for _, c := range counts {
		sum += c
	}
	if sum != worldSize {
		return 0, 0, fmt.Errorf("SLURM_NTASKS=%d, but %s=%q places %d tasks", worldSize, name, list, sum)
	}
	check := func(v string, ok func(n int) bool, want string) error {
		s := strings.TrimSpace(getenv(v))
		if s == "" {
			return nil
		}
		n, err := strconv.Atoi(s)
		if err != nil || !ok(n) {
			return fmt.Errorf("%s=%q, but %s=%q %s", v, s, name, list, want)
		}
		return nil
	}
	for _, c := range []struct {
		v    string
		ok   func(int) bool
		want string
	}{
		{"SLURM_STEP_NUM_TASKS", func(n int) bool { return n == sum }, fmt.Sprintf("places %d tasks", sum)},
		{"SLURM_STEP_NUM_NODES", func(n int) bool { return n == len(counts) }, fmt.Sprintf("lists %d nodes", len(counts))},
		{"SLURM_NNODES", func(n int) bool { return n == len(counts) }, fmt.Sprintf("lists %d nodes", len(counts))},
		// The allocation's nodes: a step may use some of them, not more.
		{"SLURM_JOB_NUM_NODES", func(n int) bool { return n >= len(counts) }, fmt.Sprintf("lists %d nodes", len(counts))},
	} {
		if err := check(c.v, c.ok, c.want); err != nil {
			return 0, 0, err
		}
	}
	if !haveNode && len(counts) > 1 {
		return 0, 0, fmt.Errorf("%s=%q lists %d nodes, but SLURM_NODEID is not set", name, list, len(counts))
	}
	if nodeRank >= len(counts) {
		return 0, 0, fmt.Errorf("SLURM_NODEID=%d, but %s=%q lists %d nodes", nodeRank, name, list, len(counts))
	}
	return counts[nodeRank], len(counts), nil
}

// sanitizeID keeps a launcher's job id to what store keys and
// shared-memory names take (letters, digits, '.', '_', '-'; others become
// '_'), at most 64 bytes (a longer one is cut and ends with a hash of the
// whole, so that ids differing only at the end stay apart).
func sanitizeID(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			b[i] = '_'
		}
	}
	if len(b) > 64 {
		h := fnv.New64a()
		h.Write([]byte(s))
		return string(b[:47]) + "-" + fmt.Sprintf("%016x", h.Sum64())
	}
	return string(b)
}

// derivedPort is the store's port of a launcher's job that names none: a
// hash of the job id into [20000, 30000), below Linux's ephemeral range
// (32768-60999) so that no outgoing connection holds it by chance.
func derivedPort(jobID string) int {
	h := fnv.New32a()
	h.Write([]byte(jobID))
	return 20000 + int(h.Sum32()%10000)
}

// ompiSecret is mpirun's per-job random value
// (OMPI_MCA_orte_precondition_transports, two 64-bit halves in hex) as a
// job secret, or nil where the value is not of that form or is not random:
// OpenMPI direct-launched by srun derives it from the job id instead
// (equal halves, or zero), which anyone can guess.
func ompiSecret(v string) []byte {
	v = strings.TrimSpace(v)
	a, b, ok := strings.Cut(v, "-")
	if !ok || len(a) != 16 || len(b) != 16 || a == b {
		return nil
	}
	x, errA := strconv.ParseUint(a, 16, 64)
	y, errB := strconv.ParseUint(b, 16, 64)
	if errA != nil || errB != nil || x == 0 || y == 0 {
		return nil
	}
	return []byte(v)
}

func envOptions() (Options, error) { return LoadEnv(os.Getenv) }
