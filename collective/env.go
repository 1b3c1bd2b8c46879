package collective

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/bytesize"
	"github.com/slimego/slimego/internal/fault"
)

// DefaultPort is the master port when neither the options nor the
// environment give one (torchrun's default).
const DefaultPort = 29500

// Options configure [Init]. Zero fields are filled from the environment
// ([LoadEnv]); fields already set win over it.
type Options struct {
	// Rank and WorldSize: this rank and the number of ranks. WorldSize 0
	// means "from the environment".
	Rank, WorldSize int
	// LocalRank and LocalWorldSize: the rank on this node and the number
	// of ranks on each node.
	LocalRank, LocalWorldSize int
	// NodeRank is this node's index (GROUP_RANK).
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
	// Timeout bounds every wait (SLIME_TIMEOUT; default 5 minutes).
	Timeout time.Duration
	// Backend is cpu, cuda or auto (SLIME_BACKEND).
	Backend device.Kind
	// Debug is "", "INFO" or "TRACE" (SLIME_DEBUG): what Init logs to
	// stderr.
	Debug string
	// Algo is the algorithm across nodes (SLIME_ALGO): "hier" (rail-aligned
	// hierarchical; needs the same number of ranks on every node, laid out
	// node by node), "ring" (a flat ring over TCP, any layout) or "auto"
	// (the default: hier where the layout allows it, ring elsewhere).
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
	// SpinTime is how long a shared-memory wait polls before it sleeps
	// (SLIME_SPIN, a Go duration; default by ranks per core).
	SpinTime time.Duration
	// SlotBytes, Slots, ZeroCopyMin, CMAMin and BigCopy tune the
	// shared-memory protocol (SLIME_SLOT_BYTES, SLIME_SLOTS,
	// SLIME_ZERO_COPY_MIN, SLIME_CMA_MIN, SLIME_BIG_COPY; a negative CMAMin
	// turns cross-memory attach off).
	SlotBytes, Slots, ZeroCopyMin, CMAMin, BigCopy int
	// Eager launches GPU work directly instead of capturing it into CUDA
	// graphs (SLIME_EAGER=1; the commands' --eager-mode).
	Eager bool
	// GPUScratch is the bytes of one block in the GPU all-gather's scratch
	// slots (SLIME_GPU_SCRATCH; default 16 MiB): each rank holds 2 × local
	// ranks × GPUScratch of device memory, and larger blocks go in rounds.
	GPUScratch int
}

// LoadEnv reads the environment that slimerun and torchrun (RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
// MASTER_PORT), Slurm's srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
// SLURM_NTASKS_PER_NODE, SLURM_NODEID) and OpenMPI's mpirun
// (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
// OMPI_COMM_WORLD_LOCAL_SIZE) set, in that order of preference, plus the
// SLIME_* knobs. getenv is os.Getenv in practice; tests pass a map.
func LoadEnv(getenv func(string) string) (Options, error) {
	var o Options
	bad := func(format string, a ...any) (Options, error) {
		return o, fmt.Errorf("collective: environment: %w: "+format, append([]any{fault.ErrInvalid}, a...)...)
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
	var rankVar, sizeVar string
	if o.Rank, rankVar, err = first("RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"); err != nil {
		return bad("%v", err)
	}
	if o.WorldSize, sizeVar, err = first("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"); err != nil {
		return bad("%v", err)
	}
	if sizeVar == "" {
		// Not launched by anything: a world of one.
		o.WorldSize, o.Rank = 1, 0
	} else if rankVar == "" {
		return bad("%s=%d is set but no rank variable (RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID)", sizeVar, o.WorldSize)
	}
	if o.WorldSize == 0 {
		return bad("%s=0", sizeVar)
	}
	if o.Rank >= o.WorldSize {
		return bad("%s=%d is not below %s=%d", rankVar, o.Rank, sizeVar, o.WorldSize)
	}
	if o.LocalRank, _, err = first("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"); err != nil {
		return bad("%v", err)
	}
	var lwsVar string
	if o.LocalWorldSize, lwsVar, err = first("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"); err != nil {
		return bad("%v", err)
	}
	if lwsVar == "" {
		if t := getenv("SLURM_NTASKS_PER_NODE"); t != "" {
			n, err := strconv.Atoi(strings.TrimSpace(t))
			if err != nil {
				return bad("SLURM_NTASKS_PER_NODE=%q is not an integer", t)
			}
			o.LocalWorldSize = n
		} else {
			o.LocalWorldSize = o.WorldSize // one node
			o.LocalRank = o.Rank
		}
	}
	if o.LocalWorldSize == 0 || o.LocalRank >= o.LocalWorldSize {
		return bad("local rank %d of local world size %d", o.LocalRank, o.LocalWorldSize)
	}
	nodeRank, nodeVar, err := first("GROUP_RANK", "SLURM_NODEID")
	if err != nil {
		return bad("%v", err)
	}
	if nodeVar == "" {
		nodeRank = o.Rank / o.LocalWorldSize
	}
	// Nodes may differ in size (Slurm's uneven task counts): Init learns
	// the whole layout from the ranks themselves.
	o.NodeRank = nodeRank
	o.MasterAddr = strings.TrimSpace(getenv("MASTER_ADDR"))
	if o.MasterAddr == "" && o.WorldSize > 1 {
		return bad("MASTER_ADDR is not set (the host of rank 0, or of the launcher's store)")
	}
	port, ok, err := num("MASTER_PORT")
	if err != nil {
		return bad("%v", err)
	}
	if !ok {
		port = DefaultPort
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
	o.RunID = firstNonEmpty(getenv("SLIME_RUN_ID"), getenv("TORCHELASTIC_RUN_ID"), "port"+strconv.Itoa(o.MasterPort))
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
		b, err := readSecretFile(f)
		if err != nil {
			return bad("SLIME_JOB_SECRET_FILE: %v", err)
		}
		o.JobSecret = b
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
	o.Debug = strings.ToUpper(strings.TrimSpace(getenv("SLIME_DEBUG")))
	o.Algo = strings.ToLower(strings.TrimSpace(getenv("SLIME_ALGO")))
	if o.Algo != "" && o.Algo != "auto" && o.Algo != "hier" && o.Algo != "ring" {
		return bad("SLIME_ALGO=%q: want auto, hier or ring", o.Algo)
	}
	o.SocketIfName = strings.TrimSpace(getenv("SLIME_SOCKET_IFNAME"))
	if v := strings.TrimSpace(getenv("SLIME_SPIN")); v != "" {
		d, err := parseDuration(v)
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
			*k.dst = int(n)
		}
	}
	return o, nil
}

// readSecretFile reads a job secret: the file's first line, which must
// not be empty.
func readSecretFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	line = strings.TrimSpace(line)
	if line == "" {
		return nil, fmt.Errorf("%s holds no secret", path)
	}
	return []byte(line), nil
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// parseDuration accepts Go durations ("90s", "2m") and plain seconds ("30").
func parseDuration(s string) (time.Duration, error) {
	if n, err := strconv.ParseFloat(s, 64); err == nil {
		return time.Duration(n * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(s)
	if err == nil && d <= 0 {
		err = fmt.Errorf("not positive")
	}
	return d, err
}

func envOptions() (Options, error) { return LoadEnv(os.Getenv) }
