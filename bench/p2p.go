package bench

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/inter"
	"github.com/slimego/slimego/internal/bytesize"
	"github.com/slimego/slimego/internal/machine"
	"github.com/slimego/slimego/p2p"
	"github.com/slimego/slimego/rendezvous"
)

// P2PCSVHeader is the column list of slimebench p2p's CSV (issue 16).
var P2PCSVHeader = []string{"impl", "transport", "op", "S", "batch", "concurrency", "p50_us", "p99_us", "GBps", "cpu_s_per_GB", "wrong"}

// P2PResult is one row of slimebench p2p.
//
//   - impl "p2p", op read or write: Concurrency batches of Batch operations of
//     S bytes each are started at once, then waited; P50 and P99 are the
//     latencies of one batch (its start to its completion), GBps the bytes
//     of all batches over the time of the rounds, CPUPerGB the CPU seconds
//     of both processes (getrusage) per 10⁹ bytes moved, Wrong the bytes
//     that differed from the random data sent, over every transfer.
//   - impl "p2p", op register: the time (P50 = P99, µs) to register Batch
//     regions of S bytes (1 GiB as 4 KiB pages, or as one region).
//   - impl "tcp": the raw TCP link (TCP): op pingpong, S 8, P50 the median
//     round trip; op oneway, the median time and bandwidth of S bytes
//     striped over the transport's channels (Transport "tcp-N"). TCP gives
//     medians only: P99 is 0.
//   - impl "memcpy": one thread copying S bytes (Memcpy); P99 is 0.
//   - ops ending in "-paired": an 8-byte p2p read, a ping-pong, and at the
//     sizes the targets name a p2p read, a one-way transfer and a memcpy,
//     measured alternately within each iteration (paired); GBps from P50;
//     CPU not measured (0).
//
// Only the p2p transfers (reads and writes, paired or not) check their
// bytes: the other rows (raw TCP, memcpy, registration) are Unchecked,
// and their Wrong counts nothing.
type P2PResult struct {
	Impl, Transport, Op string
	S                   int64
	Batch, Concurrency  int
	P50, P99            float64 // µs
	GBps                float64
	CPUPerGB            float64
	Wrong               int64
	// Unchecked: no byte of the row is compared with what was sent; its
	// wrong column is '-' in the table and empty in the CSV.
	Unchecked bool
}

// P2PConfig is what P2P measures.
type P2PConfig struct {
	Sizes       []int64  // bytes per operation (default 2 KiB … 128 MiB by ×2)
	Batches     []int    // operations per batched call (default 1, 64)
	Concurrency []int    // batches in flight at once (default 1, 8)
	Ops         []string // "read", "write" (default both), "writeimm" (WriteWithImm: each batch ends with an immediate, which rank 0 takes in and checks)
	// MaxInFlight skips the (size, batch, concurrency) combinations that
	// would move more bytes at once than this (default 256 MiB): each
	// operation has its own range on both sides, so that every byte is
	// checked, and the grid's largest corner is 64 GiB.
	MaxInFlight int64
	TCPOnly     bool // carry every transfer over TCP, even on one host
	// Shared registers each rank's region as p2p.Shared memory, which a
	// peer on the same host maps and copies itself ("shm"), instead of a
	// plain slice (copied by process_vm_readv/writev, "cma").
	Shared bool
	// Symmetric registers each rank's part of symmetric memory
	// (collective's Alloc, a file in /dev/shm) as p2p.Shared memory
	// (MapShared), which a peer on the same host maps and copies itself
	// ("shm").
	Symmetric bool
	// Huge registers each rank's region as plain memory (copied by
	// process_vm_readv/writev on one host, "cma") from an anonymous
	// mapping advised to use transparent huge pages, which the kernel
	// pins a huge page at a time instead of 4 KiB at a time.
	Huge bool
	// OnRegion, if set, is called on each rank with its region's host
	// memory once it is allocated and touched, before any transfer (where
	// the memory is GPU memory: with its host copy).
	OnRegion func(region []byte)
	// GPU registers each rank's region as GPU memory (a CUDABuffer on
	// device LocalRank mod the devices there are), which a peer on the
	// same host copies device to device through CUDA IPC ("ipc") and
	// other peers stage through host memory over TCP. Rank 1's operations
	// are GPU memory too. The random data goes up, and is checked, through
	// host copies outside the timed window. The baselines' paired rows
	// (host memory) are left out.
	GPU       bool
	Channels  int           // TCP connections of the link (0: p2p's default)
	MinTime   time.Duration // timed time per combination (default 200 ms), at least 5 rounds
	MaxRounds int           // at most this many timed rounds per combination (default 2000)
	// RegisterBytes, if positive, is the memory whose registration is
	// timed, as 4 KiB pages and as one region (issue 16 asks for 1 GiB):
	// a multiple of 4 KiB, at least 8 KiB.
	RegisterBytes int64
	// Baselines adds raw TCP (8-byte ping-pong and one-way transfers of
	// the sizes the targets compare with), an 8-byte read, and
	// single-thread memcpy, all from this run.
	Baselines bool
	// Progress, if set, is called on rank 0 with each row.
	Progress func(P2PResult)
	// Failed, if set, is called with P2P's error once the endpoint is
	// made, before its Close: for a peer that is alive but silent
	// (stopped, say) Close waits up to heartbeats for its leases to be
	// given back, and the error can be said without that wait.
	Failed func(error)
}

func (cfg *P2PConfig) defaults() {
	if len(cfg.Sizes) == 0 {
		for s := int64(2 << 10); s <= 128<<20; s *= 2 {
			cfg.Sizes = append(cfg.Sizes, s)
		}
	}
	if len(cfg.Batches) == 0 {
		cfg.Batches = []int{1, 64}
	}
	if len(cfg.Concurrency) == 0 {
		cfg.Concurrency = []int{1, 8}
	}
	if len(cfg.Ops) == 0 {
		cfg.Ops = []string{"read", "write"}
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 256 << 20
	}
	if cfg.MinTime <= 0 {
		cfg.MinTime = 200 * time.Millisecond
	}
	if cfg.MaxRounds <= 0 {
		cfg.MaxRounds = 2000
	}
}

// p2pCase is one combination of the grid.
type p2pCase struct {
	op          string
	s           int64
	batch, conc int
}

func (k p2pCase) bytes() int64 { return k.s * int64(k.batch) * int64(k.conc) }

// cases is the grid in the order both ranks run it, without the
// combinations over MaxInFlight.
func (cfg *P2PConfig) cases() []p2pCase {
	var ks []p2pCase
	if cfg.Baselines {
		ks = append(ks, p2pCase{"read", 8, 1, 1})
	}
	for _, op := range cfg.Ops {
		for _, b := range cfg.Batches {
			for _, k := range cfg.Concurrency {
				for _, s := range cfg.Sizes {
					if c := (p2pCase{op, s, b, k}); c.bytes() <= cfg.MaxInFlight {
						ks = append(ks, c)
					}
				}
			}
		}
	}
	return ks
}

// Skipped lists the grid's combinations that MaxInFlight leaves out.
func (cfg P2PConfig) Skipped() []string {
	cfg.defaults()
	var out []string
	for _, op := range cfg.Ops {
		for _, b := range cfg.Batches {
			for _, k := range cfg.Concurrency {
				for _, s := range cfg.Sizes {
					if c := (p2pCase{op, s, b, k}); c.bytes() > cfg.MaxInFlight {
						out = append(out, fmt.Sprintf("%s S=%s batch=%d concurrency=%d", op, bytesize.Format(s), b, k))
					}
				}
			}
		}
	}
	return out
}

// memory is machine.Memory, which tests replace to bound the memory P2P
// may use.
var memory = machine.Memory

// ErrP2PBench marks a failure of the p2p benchmark's own protocol.
var ErrP2PBench = errors.New("bench: p2p")

// Control messages from the initiator (rank 1) to the target (rank 0).
const (
	ctlEnd   = 0 // the combination is over: answer with the CPU seconds
	ctlRound = 1 // a round of writes is done: check, clear, answer wrong
	ctlStart = 2 // the warm-up is over: the timed rounds, whose CPU counts, begin
)

// P2P measures the p2p engine between the two ranks of c: rank 1 reads
// from and writes to a region rank 0 registered, over the transport the
// link chose (the same-host copy, or TCP; TCPOnly forces TCP). Both ranks
// return the rows; rank 0's carry the figures.
//
// Each round starts Concurrency batches at once and waits for them. The
// source of every round is random (a ChaCha8 stream both sides derive from
// a seed they agreed on), and the destination is cleared before each round
// and compared byte for byte after it (reads by rank 1, writes by rank 0,
// told over the link's Send/Recv), outside the timed window. CPU time is
// getrusage's, of rank 1 over the timed rounds and of rank 0 from the
// first timed round to the last (not the warm-up round), less its checking.
func P2P(ctx context.Context, c *collective.Communicator, cfg P2PConfig) (_ []P2PResult, err error) {
	cfg.defaults()
	if err := P2PWorld(c); err != nil {
		return nil, err
	}
	if err := CheckRegisterBytes(cfg.RegisterBytes); err != nil {
		return nil, fmt.Errorf("%w: registering %d bytes: %v", ErrP2PBench, cfg.RegisterBytes, err)
	}
	// A seed both ranks agree on: the random data's, and the store prefix
	// of this run's endpoints.
	seeds := make([]uint64, 2)
	if err := collective.AllGatherOf(ctx, c, seeds, []uint64{rand.Uint64()}); err != nil {
		return nil, err
	}
	o := c.Options()
	st, err := rendezvous.Dial(ctx, net.JoinHostPort(o.MasterAddr, strconv.Itoa(o.MasterPort)), rendezvous.Auth{Secret: o.JobSecret, Job: o.JobID})
	if err != nil {
		return nil, fmt.Errorf("%w: rank %d: the store: %w", ErrP2PBench, c.Rank(), err)
	}
	defer st.Close()
	st.Timeout = c.Timeout()
	cases := cfg.cases()
	var need int64 = 8
	for _, k := range cases {
		need = max(need, k.bytes())
	}
	// paired's largest batch (not measured on GPU memory), and the raw
	// TCP baseline's largest transfer
	var most, tcpMost int64
	if cfg.Baselines && !cfg.GPU {
		for _, k := range cfg.pairs() {
			most = max(most, k.bytes())
		}
		need = max(need, most)
	}
	if cfg.Baselines {
		for _, n := range cfg.tcpSizes() {
			tcpMost = max(tcpMost, n)
		}
	}
	// Each rank holds the region and the expected bytes (host memory),
	// paired's three buffers, and the raw TCP baseline's send and receive
	// buffers (or rank 0's memcpy's two), and every rank of this host as
	// much: refused here, with what to lower, rather than by the runtime
	// (or the kernel) running out of memory.
	here := (2*need + 3*most + 2*tcpMost) * int64(max(o.LocalWorldSize, 1))
	if avail, total, ok := memory(); ok {
		if here > avail {
			return nil, fmt.Errorf("%w: rank %d: the grid's largest combination (size × batch × concurrency) is %s, which needs %.1f GiB of memory here (%d rank(s) of this host), and %.1f GiB is available: lower --max-bytes or --max-in-flight",
				ErrP2PBench, c.Rank(), bytesize.Format(need), gib(here), max(o.LocalWorldSize, 1), gib(avail))
		}
		if cfg.RegisterBytes > total {
			return nil, fmt.Errorf("%w: rank %d: registering %.1f GiB, more than this machine's memory (%.1f GiB)", ErrP2PBench, c.Rank(), gib(cfg.RegisterBytes), gib(total))
		}
	}
	var region []byte
	var mem any
	var gpuBuf *device.CUDABuffer
	if cfg.GPU {
		g, err := device.OpenLocalGPU(c.LocalRank())
		if err == nil {
			gpuBuf, err = g.Alloc(int(need))
		}
		if err != nil {
			return nil, fmt.Errorf("%w: rank %d: GPU memory: %w", ErrP2PBench, c.Rank(), err)
		}
		defer gpuBuf.Free() // after the endpoint's Close (deferred below)
		region, mem = make([]byte, need), gpuBuf
	} else if cfg.Symmetric {
		buf, err := c.Alloc(ctx, int(need))
		if err != nil {
			return nil, fmt.Errorf("%w: rank %d: symmetric memory: %w", ErrP2PBench, c.Rank(), err)
		}
		defer buf.Free()
		fd, off := buf.File()
		sh, err := p2p.MapShared(fd, off, int(need))
		if err != nil {
			return nil, fmt.Errorf("%w: rank %d: %w", ErrP2PBench, c.Rank(), err)
		}
		defer sh.Close()              // after the endpoint's Close (deferred below)
		region, mem = buf.Bytes(), sh // the same pages
	} else if cfg.Shared {
		sh, err := p2p.NewShared(int(need))
		if err != nil {
			return nil, fmt.Errorf("%w: rank %d: %w", ErrP2PBench, c.Rank(), err)
		}
		defer sh.Close() // after the endpoint's Close (deferred below)
		region, mem = sh.Bytes(), sh
	} else if cfg.Huge {
		b, free, err := machine.AllocHuge(int(need))
		if err != nil {
			return nil, fmt.Errorf("%w: rank %d: %w", ErrP2PBench, c.Rank(), err)
		}
		defer free() // after the endpoint's Close (deferred below)
		for i := 0; i < len(b); i += machine.HugePageSize {
			b[i] = 1 // a fault per huge page, here rather than in a timed call
		}
		region, mem = b, b
	} else {
		region = make([]byte, need)
		mem = region
	}
	prefix := o.StoreKey(fmt.Sprintf("p2pbench-%x", seeds[0])) // under the attempt: aborted when a rank exits
	e, err := p2p.New(ctx, p2p.Options{Name: fmt.Sprintf("rank%d", c.Rank()), Store: st, Prefix: prefix,
		Auth: rendezvous.Auth{Secret: o.JobSecret, Job: o.JobID}, IfName: o.SocketIfName, MasterAddr: o.MasterAddr,
		Channels: cfg.Channels, TCPOnly: cfg.TCPOnly, Timeout: c.Timeout()})
	if err != nil {
		return nil, fmt.Errorf("%w: rank %d: %w", ErrP2PBench, c.Rank(), err)
	}
	defer e.Close()
	defer func() { // before the Close
		if err != nil && cfg.Failed != nil {
			cfg.Failed(err)
		}
	}()
	expect := make([]byte, need)
	if cfg.OnRegion != nil {
		cfg.OnRegion(region)
	}
	reg, err := e.Register("bench", mem)
	if err != nil {
		return nil, err
	}
	if err := e.Publish(ctx); err != nil {
		return nil, err
	}
	peer, err := e.Connect(ctx, fmt.Sprintf("rank%d", 1-c.Rank()))
	if err != nil {
		return nil, err
	}
	remote, ok := peer.Remote("bench")
	if !ok {
		return nil, fmt.Errorf("%w: rank %d: rank %d's Info lists no region \"bench\"", ErrP2PBench, c.Rank(), 1-c.Rank())
	}
	b := &p2pBench{c: c, cfg: cfg, e: e, peer: peer, local: reg, remote: remote, region: region, gpu: gpuBuf, expect: expect, seed: seeds[1], timeout: c.Timeout()}
	if err := b.warm(ctx); err != nil {
		return nil, err
	}
	var rows []P2PResult
	emit := func(r P2PResult) {
		rows = append(rows, r)
		if cfg.Progress != nil && c.Rank() == 0 {
			cfg.Progress(r)
		}
	}
	for i, k := range cases {
		r, err := b.run(ctx, i, k)
		if err != nil {
			return nil, err
		}
		emit(r)
	}
	if cfg.Baselines {
		if err := b.baselines(ctx, emit); err != nil {
			return nil, err
		}
		if !cfg.GPU {
			if err := b.paired(ctx, emit); err != nil {
				return nil, err
			}
		}
	}
	if cfg.RegisterBytes > 0 {
		if err := b.register(ctx, emit); err != nil {
			return nil, err
		}
	}
	// Neither endpoint closes before the other's last call has its answer
	// (rank 0 may have its last figures before rank 1's Send is answered).
	if err := c.Barrier(ctx); err != nil {
		return nil, err
	}
	return rows, nil
}

// warm reads a byte of the peer's region until the read is copied
// through a lease (at most a second): on one host a link's first transfer
// to a region asks for the region's lease, and the figures are to be
// those of the transfers after it. Over TCP one read does.
//
// Both ranks warm up at once, each reading its peer's region into its
// own: each reads byte 1 into byte 0, so that neither writes a byte the
// other's read is copying out.
func (b *p2pBench) warm(ctx context.Context) error {
	op := []p2p.Op{{Local: b.local, Remote: b.remote, RemoteOff: 1, Len: 1}}
	for end := time.Now().Add(time.Second); ; {
		f := b.peer.Read(op)
		if err := f.Wait(ctx); err != nil {
			return fmt.Errorf("%w: rank %d: a first read: %w", ErrP2PBench, b.c.Rank(), err)
		}
		if f.Transport() != "tcp" || b.peer.Transport() == "tcp" || time.Now().After(end) {
			return nil
		}
		time.Sleep(time.Millisecond)
	}
}

type p2pBench struct {
	c              *collective.Communicator
	cfg            P2PConfig
	e              *p2p.Endpoint
	peer           *p2p.Peer
	local          *p2p.Region
	remote         p2p.RemoteRegion
	region, expect []byte
	// gpu, when set, is the registered region: region is its host copy,
	// which sync and zero keep in step outside the timed window.
	gpu     *device.CUDABuffer
	seed    uint64
	timeout time.Duration
}

// warmBytes is what a write round uploads again of its source before
// it is timed (run's round): enough to use the GPU, little to copy.
const warmBytes = 4096

// sync copies region's first n bytes to the GPU region (up) or back (if
// there is a GPU region).
func (b *p2pBench) sync(n int, up bool) error {
	if b.gpu == nil {
		return nil
	}
	v, err := b.gpu.Slice(0, n)
	switch {
	case err != nil:
	case up:
		err = v.CopyFromHost(b.region[:n])
	default:
		err = v.CopyToHost(b.region[:n])
	}
	return err
}

// zero clears the region's first n bytes (and the GPU region's).
func (b *p2pBench) zero(n int) error {
	clear(b.region[:n])
	if b.gpu == nil {
		return nil
	}
	return b.gpu.Dev.Lib().Memset(b.gpu.Dev.Ordinal, b.gpu.Ptr, 0, uint64(n))
}

// fill writes combination i's random data into b.
func (b *p2pBench) fill(i int, buf []byte) {
	var seed [32]byte
	binary.LittleEndian.PutUint64(seed[:], b.seed)
	binary.LittleEndian.PutUint64(seed[8:], uint64(i))
	rand.NewChaCha8(seed).Read(buf)
}

// countWrongBytes counts the bytes of got that differ from want.
func countWrongBytes(got, want []byte) int64 {
	var n int64
	const chunk = 64 << 10
	for off := 0; off < len(got); off += chunk {
		g, w := got[off:min(off+chunk, len(got))], want[off:min(off+chunk, len(want))]
		if bytes.Equal(g, w) {
			continue
		}
		for j := range g {
			if g[j] != w[j] {
				n++
			}
		}
	}
	return n
}

// cpuSeconds is this process's user and system CPU time.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// ctl sends one control word to the peer and waits for its answer.
func (b *p2pBench) ctl(ctx context.Context, what string, v uint64) (uint64, error) {
	var out, in [8]byte
	binary.LittleEndian.PutUint64(out[:], v)
	if err := b.peer.Send(out[:]).Wait(ctx); err != nil {
		return 0, fmt.Errorf("%w: rank %d: %s: %w", ErrP2PBench, b.c.Rank(), what, err)
	}
	if err := b.peer.Recv(in[:]).Wait(ctx); err != nil {
		return 0, fmt.Errorf("%w: rank %d: %s: %w", ErrP2PBench, b.c.Rank(), what, err)
	}
	return binary.LittleEndian.Uint64(in[:]), nil
}

// recvCtl waits for the peer's next control word.
func (b *p2pBench) recvCtl(ctx context.Context) (uint64, error) {
	var in [8]byte
	if err := b.peer.Recv(in[:]).Wait(ctx); err != nil {
		return 0, fmt.Errorf("%w: rank %d: waiting for rank 1: %w", ErrP2PBench, b.c.Rank(), err)
	}
	return binary.LittleEndian.Uint64(in[:]), nil
}

func (b *p2pBench) answer(ctx context.Context, v uint64) error {
	var out [8]byte
	binary.LittleEndian.PutUint64(out[:], v)
	if err := b.peer.Send(out[:]).Wait(ctx); err != nil {
		return fmt.Errorf("%w: rank %d: answering rank 1: %w", ErrP2PBench, b.c.Rank(), err)
	}
	return nil
}

// run measures combination i on both ranks.
func (b *p2pBench) run(parent context.Context, i int, k p2pCase) (P2PResult, error) {
	ctx, cancel := context.WithTimeout(parent, b.timeout)
	defer cancel()
	n := int(k.bytes())
	res := P2PResult{Impl: "p2p", Op: k.op, S: k.s, Batch: k.batch, Concurrency: k.conc}
	if b.c.Rank() == 0 {
		// The target: its region is the source of reads (random) and the
		// destination of writes (cleared, checked after each round).
		var err error
		if k.op == "read" {
			b.fill(i, b.region[:n])
			err = b.sync(n, true)
		} else {
			b.fill(i, b.expect[:n])
			err = b.zero(n)
		}
		if err != nil {
			return res, fmt.Errorf("%w: rank 0: GPU memory: %w", ErrP2PBench, err)
		}
		if err := b.answer(ctx, 0); err != nil { // ready
			return res, err
		}
		cpu0, checking := cpuSeconds(), 0.0
		var rounds uint32
		seen := make(map[uint32]bool, k.conc)
		for {
			v, err := b.recvCtl(ctx)
			if err != nil {
				return res, err
			}
			if v == ctlEnd {
				cpu := cpuSeconds() - cpu0 - checking
				if err := b.answer(ctx, uint64(cpu*1e9)); err != nil {
					return res, err
				}
				break
			}
			if v == ctlStart {
				// The CPU counted is the timed rounds', whose bytes it
				// is divided by: not the warm-up round's.
				cpu0, checking = cpuSeconds(), 0
				if err := b.answer(ctx, 0); err != nil {
					return res, err
				}
				continue
			}
			t := cpuSeconds()
			if err := b.sync(n, false); err != nil {
				return res, fmt.Errorf("%w: rank 0: GPU memory: %w", ErrP2PBench, err)
			}
			wrong := countWrongBytes(b.region[:n], b.expect[:n])
			if k.op == "writeimm" {
				// This round's immediates, each once (batches end in any
				// order): a wrong or repeated one counts as wrong.
				clear(seen)
				for range k.conc {
					im, err := b.e.Imm(ctx)
					if err != nil {
						return res, fmt.Errorf("%w: rank 0: the immediates of round %d: %w", ErrP2PBench, rounds, err)
					}
					v := im.Value - rounds*uint32(k.conc)
					if v >= uint32(k.conc) || seen[v] {
						wrong++
					}
					seen[v] = true
				}
				rounds++
			}
			if err := b.zero(n); err != nil {
				return res, fmt.Errorf("%w: rank 0: GPU memory: %w", ErrP2PBench, err)
			}
			checking += cpuSeconds() - t
			if err := b.answer(ctx, uint64(wrong)); err != nil {
				return res, err
			}
		}
		// Rank 1 sends the figures.
		return b.recvResult(ctx, res)
	}
	// The initiator.
	src := b.region[:n]
	if k.op == "read" {
		b.fill(i, b.expect[:n])
	} else {
		b.fill(i, src)
		if err := b.sync(n, true); err != nil {
			return res, fmt.Errorf("%w: rank 1: GPU memory: %w", ErrP2PBench, err)
		}
	}
	if _, err := b.recvCtl(ctx); err != nil { // the target is ready
		return res, err
	}
	batches := make([][]p2p.Op, k.conc)
	for j := range batches {
		for o := range k.batch {
			off := (j*k.batch + pageAt(o, k.batch)) * int(k.s)
			batches[j] = append(batches[j], p2p.Op{Local: b.local, LocalOff: off, Remote: b.remote, RemoteOff: off, Len: int(k.s)})
		}
	}
	futs := make([]*p2p.Future, k.conc)
	var seq uint32 // rounds so far (the immediates of writeimm)
	lat := make([]float64, k.conc)
	var lats []float64
	var busy, cpu float64
	transports := map[string]bool{}
	var wg sync.WaitGroup
	round := func(timed bool) error {
		// A round's timed calls follow this rank's own synchronous work on
		// its GPU memory, reads and writes alike: a read's destination is
		// cleared, a write's source has its first bytes uploaded again
		// (the same bytes). Without it a write round would start right
		// after the ctl exchange of the last round's check, in which the
		// target copied and cleared its GPU memory while this rank slept,
		// and its first copy would pay for that once per round, as no
		// read does: a fixed cost of the harness, not of a write.
		var err error
		if k.op == "read" {
			err = b.zero(n)
		} else {
			err = b.sync(min(n, warmBytes), true)
		}
		if err != nil {
			return fmt.Errorf("%w: rank 1: GPU memory: %w", ErrP2PBench, err)
		}
		c0 := cpuSeconds()
		t0 := time.Now()
		for j, ops := range batches {
			switch k.op {
			case "read":
				futs[j] = b.peer.Read(ops)
			case "writeimm":
				futs[j] = b.peer.WriteWithImm(ops, seq*uint32(k.conc)+uint32(j))
			default:
				futs[j] = b.peer.Write(ops)
			}
		}
		errs := make([]error, k.conc)
		if k.conc == 1 {
			errs[0] = futs[0].Wait(ctx)
			lat[0] = float64(time.Since(t0).Nanoseconds()) / 1e3
		} else {
			wg.Add(k.conc)
			for j, f := range futs {
				go func() {
					defer wg.Done()
					errs[j] = f.Wait(ctx)
					lat[j] = float64(time.Since(t0).Nanoseconds()) / 1e3
				}()
			}
			wg.Wait()
		}
		el := time.Since(t0).Seconds()
		dc := cpuSeconds() - c0
		seq++
		for j, err := range errs {
			if err != nil {
				return fmt.Errorf("%w: rank 1: %s of %d × %s, batch %d of %d: %w", ErrP2PBench, k.op, k.batch, bytesize.Format(k.s), j, k.conc, err)
			}
			transports[futs[j].Transport()] = true
		}
		if timed {
			busy += el
			cpu += dc
			lats = append(lats, lat...)
		}
		if k.op == "read" {
			if err := b.sync(n, false); err != nil {
				return fmt.Errorf("%w: rank 1: GPU memory: %w", ErrP2PBench, err)
			}
			res.Wrong += countWrongBytes(src, b.expect[:n])
			return nil
		}
		wrong, err := b.ctl(ctx, "checking a round of writes", ctlRound)
		res.Wrong += int64(wrong)
		return err
	}
	if err := round(false); err != nil { // warm-up, checked too
		return res, err
	}
	if testHookWarmedUp != nil {
		testHookWarmedUp()
	}
	if _, err := b.ctl(ctx, "starting the timed rounds", ctlStart); err != nil {
		return res, err
	}
	rounds := 0
	for rounds < 5 || (busy < b.cfg.MinTime.Seconds() && rounds < b.cfg.MaxRounds) {
		if err := round(true); err != nil {
			return res, err
		}
		rounds++
	}
	tcpu, err := b.ctl(ctx, "ending a combination", ctlEnd)
	if err != nil {
		return res, err
	}
	cpu += float64(tcpu) / 1e9
	moved := float64(rounds) * float64(n)
	sort.Float64s(lats)
	res.P50, res.P99 = quantile(lats, 0.5), quantile(lats, 0.99)
	res.GBps = moved / busy / 1e9
	res.CPUPerGB = cpu / (moved / 1e9)
	var ts []string
	for t := range transports {
		ts = append(ts, t)
	}
	sort.Strings(ts)
	res.Transport = joinOr(ts, "+", "-")
	return res, b.sendResult(ctx, res)
}

// testHookWarmedUp, set by tests, is called on rank 1 after a
// combination's warm-up round, before its timed rounds.
var testHookWarmedUp func()

// quantile is the q-quantile of sorted xs (nearest rank: the ⌈q·n⌉-th
// smallest, so that at least q of xs lie at or below it; the 1e-9 keeps a
// product such as 0.99·100 that floating point puts a hair above 99 at 99).
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(xs))-1e-9)) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}

func joinOr(xs []string, sep, none string) string {
	if len(xs) == 0 {
		return none
	}
	s := xs[0]
	for _, x := range xs[1:] {
		s += sep + x
	}
	return s
}

// sendResult hands rank 1's figures to rank 0, which prints them.
func (b *p2pBench) sendResult(ctx context.Context, r P2PResult) error {
	var buf [48]byte
	binary.LittleEndian.PutUint64(buf[0:], uint64(r.P50*1e3))
	binary.LittleEndian.PutUint64(buf[8:], uint64(r.P99*1e3))
	binary.LittleEndian.PutUint64(buf[16:], uint64(r.GBps*1e9))
	binary.LittleEndian.PutUint64(buf[24:], uint64(r.CPUPerGB*1e9))
	binary.LittleEndian.PutUint64(buf[32:], uint64(r.Wrong))
	copy(buf[40:], r.Transport)
	if err := b.peer.Send(buf[:]).Wait(ctx); err != nil {
		return fmt.Errorf("%w: rank 1: sending the figures: %w", ErrP2PBench, err)
	}
	return nil
}

func (b *p2pBench) recvResult(ctx context.Context, r P2PResult) (P2PResult, error) {
	var buf [48]byte
	if err := b.peer.Recv(buf[:]).Wait(ctx); err != nil {
		return r, fmt.Errorf("%w: rank 0: receiving rank 1's figures: %w", ErrP2PBench, err)
	}
	r.P50 = float64(binary.LittleEndian.Uint64(buf[0:])) / 1e3
	r.P99 = float64(binary.LittleEndian.Uint64(buf[8:])) / 1e3
	r.GBps = float64(binary.LittleEndian.Uint64(buf[16:])) / 1e9
	r.CPUPerGB = float64(binary.LittleEndian.Uint64(buf[24:])) / 1e9
	r.Wrong += int64(binary.LittleEndian.Uint64(buf[32:]))
	r.Transport = string(bytes.TrimRight(buf[40:], "\x00"))
	return r, nil
}

// tcpSizes are the one-way sizes the targets compare p2p with: each
// batch's bytes from 64 KiB up.
func (cfg *P2PConfig) tcpSizes() []int64 {
	var out []int64
	for _, s := range cfg.Sizes {
		for _, bt := range cfg.Batches {
			if n := s * int64(bt); n >= 64<<10 && n <= cfg.MaxInFlight && !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
	}
	slices.Sort(out)
	return out
}

// baselines measures raw TCP between the ranks, with the link's channels,
// and single-thread memcpy on rank 0.
func (b *p2pBench) baselines(ctx context.Context, emit func(P2PResult)) error {
	ch := b.cfg.Channels
	if ch <= 0 {
		ch = p2p.DefaultChannels
	}
	sizes := b.cfg.tcpSizes()
	o := b.c.Options()
	rs, err := TCP(ctx, b.c, o.MasterAddr, sizes, ch, false, inter.DefaultLowat, b.cfg.MinTime)
	if err != nil {
		return err
	}
	for _, r := range rs {
		if r.Latency {
			emit(P2PResult{Impl: "tcp", Transport: "tcp-1", Op: "pingpong", S: r.S, Batch: 1, Concurrency: 1, P50: 2 * r.Median, Unchecked: true})
			continue
		}
		emit(P2PResult{Impl: "tcp", Transport: fmt.Sprintf("tcp-%d", r.Channels), Op: "oneway", S: r.S, Batch: 1, Concurrency: 1, P50: r.Median, GBps: r.GBps, Unchecked: true})
	}
	for _, n := range sizes {
		var us, gbps float64
		if b.c.Rank() == 0 {
			us, gbps = Memcpy(int(n), b.cfg.MinTime)
		}
		emit(P2PResult{Impl: "memcpy", Transport: "cpu", Op: "copy", S: n, Batch: 1, Concurrency: 1, P50: us, GBps: gbps, Unchecked: true})
		if err := b.c.Barrier(ctx); err != nil {
			return err
		}
	}
	return nil
}

// register times registering (and then deregistering) RegisterBytes on
// rank 0, as 4 KiB pages and as one region.
func (b *p2pBench) register(ctx context.Context, emit func(P2PResult)) error {
	if b.c.Rank() == 0 {
		mem := make([]byte, b.cfg.RegisterBytes) // untouched: registration pins nothing
		for _, page := range []int64{4 << 10, b.cfg.RegisterBytes} {
			count := int(b.cfg.RegisterBytes / page)
			regs := make([]*p2p.Region, 0, count)
			c0, t0 := cpuSeconds(), time.Now()
			for i := range count {
				r, err := b.e.Register("page"+strconv.Itoa(i), mem[int64(i)*page:int64(i+1)*page])
				if err != nil {
					return fmt.Errorf("%w: rank 0: registering page %d of %d: %w", ErrP2PBench, i, count, err)
				}
				regs = append(regs, r)
			}
			us := float64(time.Since(t0).Nanoseconds()) / 1e3
			cpu := cpuSeconds() - c0
			for _, r := range regs {
				if err := b.e.Deregister(ctx, r); err != nil {
					return err
				}
			}
			emit(P2PResult{Impl: "p2p", Transport: "-", Op: "register", S: page, Batch: count, Concurrency: 1, P50: us, P99: us,
				GBps: float64(b.cfg.RegisterBytes) / us / 1e3, CPUPerGB: cpu / (float64(b.cfg.RegisterBytes) / 1e9), Unchecked: true})
		}
	}
	return b.c.Barrier(ctx)
}

// WriteP2PCSV writes rs with P2PCSVHeader; a figure a row does not
// measure (0: a baseline's p99 or CPU, a ping-pong's GB/s; the wrong count
// of a row that checks nothing) is left empty.
func WriteP2PCSV(w io.Writer, rs []P2PResult) error {
	cw := csv.NewWriter(w)
	cw.Write(P2PCSVHeader)
	for _, r := range rs {
		cw.Write([]string{r.Impl, r.Transport, r.Op, strconv.FormatInt(r.S, 10), strconv.Itoa(r.Batch), strconv.Itoa(r.Concurrency),
			measured(r.P50, 2, ""), measured(r.P99, 2, ""), measured(r.GBps, 4, ""), measured(r.CPUPerGB, 4, ""), r.wrong("")})
	}
	cw.Flush()
	return cw.Error()
}

// wrong is r's wrong count, or none where r checks nothing.
func (r P2PResult) wrong(none string) string {
	if r.Unchecked {
		return none
	}
	return strconv.FormatInt(r.Wrong, 10)
}

// measured formats x with prec decimals, or none where x is 0 (the row
// does not measure it).
func measured(x float64, prec int, none string) string {
	if x == 0 {
		return none
	}
	return ff(x, prec)
}

// WriteP2PTable writes rs as a table under title ("-" for a figure a row
// does not measure), then the targets as ratios of this run's
// rows (P2PTargets).
func WriteP2PTable(w io.Writer, rs []P2PResult, title string) {
	fmt.Fprintf(w, "# %s\n", title)
	fmt.Fprintf(w, "#%-7s %-9s %-15s %10s %6s %5s %11s %11s %9s %9s %6s\n", "impl", "transport", "op", "S", "batch", "conc", "p50 (us)", "p99 (us)", "GB/s", "cpu s/GB", "wrong")
	for _, r := range rs {
		fmt.Fprintf(w, " %-7s %-9s %-15s %10s %6d %5d %11s %11s %9s %9s %6s\n", r.Impl, r.Transport, r.Op, bytesize.Format(r.S), r.Batch, r.Concurrency,
			measured(r.P50, 2, "-"), measured(r.P99, 2, "-"), measured(r.GBps, 3, "-"), measured(r.CPUPerGB, 3, "-"), r.wrong("-"))
	}
	for _, l := range P2PTargets(rs) {
		fmt.Fprintln(w, "# "+l)
	}
}

// P2PTargets states issue 16's targets as ratios of the paired rows of
// one run (measured alternately, each from its median time; see paired):
// a p2p read over TCP at batch 1 and S ≥ 1 MiB against the raw link at S
// (≥ 0.9 across hosts), 64 × 64 KiB against the link at 4 MiB (≥ 0.8), the
// 8-byte read against the TCP round trip (≤ 1.2), and the same-host copy
// at S ≥ 1 MiB against single-thread memcpy at S (≥ 0.8).
func P2PTargets(rs []P2PResult) []string {
	// paired emits each read between the raw transfer and the memcpy it
	// was measured with.
	next := func(i int, impl, op string, n int64) *P2PResult {
		if i >= 0 && i < len(rs) && rs[i].Impl == impl && rs[i].Op == op && rs[i].S == n {
			return &rs[i]
		}
		return nil
	}
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "NOT met"
	}
	var out []string
	for i, r := range rs {
		if r.Impl != "p2p" || r.Op != "read-paired" {
			continue
		}
		n := r.S * int64(r.Batch)
		switch {
		case r.S == 8 && r.Batch == 1:
			if t := next(i-1, "tcp", "pingpong-paired", 8); t != nil && t.P50 > 0 {
				x := r.P50 / t.P50
				out = append(out, fmt.Sprintf("target 8-byte read p50 / TCP ping-pong p50 = %.2f / %.2f us = %.3f (<= 1.2: %s; %s)", r.P50, t.P50, x, verdict(x <= 1.2), r.Transport))
			}
		case r.Transport == "tcp" && r.Batch == 1 && r.S >= 1<<20:
			if t := next(i-1, "tcp", "oneway-paired", n); t != nil && t.GBps > 0 {
				x := r.GBps / t.GBps
				out = append(out, fmt.Sprintf("target read %s batch 1 / raw TCP = %.3f / %.3f GB/s = %.3f (>= 0.9 across hosts: %s)", bytesize.Format(r.S), r.GBps, t.GBps, x, verdict(x >= 0.9)))
			}
		case r.Transport == "tcp" && r.Batch == 64 && r.S == 64<<10:
			if t := next(i-1, "tcp", "oneway-paired", n); t != nil && t.GBps > 0 {
				x := r.GBps / t.GBps
				out = append(out, fmt.Sprintf("target read 64 x 64K / raw TCP 4M = %.3f / %.3f GB/s = %.3f (>= 0.8 across hosts: %s)", r.GBps, t.GBps, x, verdict(x >= 0.8)))
			}
		case (r.Transport == "cma" || r.Transport == "shm") && r.Batch == 1 && r.S >= 1<<20:
			if m := next(i+1, "memcpy", "copy-paired", n); m != nil && m.GBps > 0 {
				x := r.GBps / m.GBps
				out = append(out, fmt.Sprintf("target read %s same host / memcpy = %.3f / %.3f GB/s = %.3f (>= 0.8: %s)", bytesize.Format(r.S), r.GBps, m.GBps, x, verdict(x >= 0.8)))
			}
		}
	}
	return out
}

// PlotP2P draws GB/s against S (from 1 KiB), one line per (impl,
// transport, op, batch, concurrency), into a PNG.
func PlotP2P(rs []P2PResult, title, file string) error {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(9)
	p.X.Label.Text = "S: bytes per operation (p2p), per transfer (tcp, memcpy)"
	p.Y.Label.Text = "GB/s"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	// GB/s on a log scale too: memcpy is ten times the rest, small
	// operations a hundred times less.
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.TextStyle.Font.Size = vg.Points(7)
	series := map[string]plotter.XYs{}
	for _, r := range rs {
		if r.GBps <= 0 || r.S < 1024 || r.Op == "register" || strings.HasSuffix(r.Op, "-paired") {
			continue
		}
		key := fmt.Sprintf("%s/%s %s", r.Impl, r.Transport, r.Op)
		if r.Impl == "p2p" {
			key += fmt.Sprintf(" b%d c%d", r.Batch, r.Concurrency)
		}
		series[key] = append(series[key], plotter.XY{X: float64(r.S), Y: r.GBps})
	}
	keys := make([]string, 0, len(series))
	for k := range series {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var args []any
	for _, k := range keys {
		if len(series[k]) > 0 {
			args = append(args, k, series[k])
		}
	}
	if len(args) == 0 {
		return fmt.Errorf("%w: nothing to plot in %s: no row of 1 KiB or more with a bandwidth", ErrP2PBench, file)
	}
	if err := plotutil.AddLinePoints(p, args...); err != nil {
		return err
	}
	return p.Save(7*vg.Inch, 5*vg.Inch, file)
}

// pairs are the batches paired measures: an 8-byte read, each size from
// 1 MiB (batch 1), and 64 × 64 KiB, within MaxInFlight.
func (cfg *P2PConfig) pairs() []p2pCase {
	ps := []p2pCase{{"read", 8, 1, 1}}
	for _, s := range cfg.Sizes {
		if s >= 1<<20 && s <= cfg.MaxInFlight {
			ps = append(ps, p2pCase{"read", s, 1, 1})
		}
	}
	if 64*64<<10 <= cfg.MaxInFlight {
		ps = append(ps, p2pCase{"read", 64 << 10, 64, 1})
	}
	return ps
}

// paired measures what the targets compare, alternating within every
// iteration (on a shared machine the link moves by tens of percent between
// one minute and the next): an 8-byte p2p read with an 8-byte ping-pong on
// a plain socket, and for each size of 1 MiB and more (batch 1) and for 64
// × 64 KiB, a p2p read of the batch with a one-way transfer of its bytes
// striped over the same number of plain connections and a single-thread
// memcpy of its bytes. Rank
// 1 times all three (the one-way transfer from its start until rank 0's
// acknowledgements, as TCP does, sent by rank 1: rank 0 waits for it, so
// nothing is sent before it is timed); every read is checked. The rows' ops end in
// "-paired"; their CPU column is 0 (not measured).
func (b *p2pBench) paired(ctx context.Context, emit func(P2PResult)) error {
	ch := b.cfg.Channels
	if ch <= 0 {
		ch = p2p.DefaultChannels // the raw link has as many connections as p2p's
	}
	l, err := openLink(ctx, b.c, b.c.Options().MasterAddr, ch, inter.DefaultLowat)
	if err != nil {
		return err
	}
	defer l.close()
	pairs := b.cfg.pairs()
	var most int64
	for _, pr := range pairs {
		most = max(most, pr.bytes())
	}
	// The memcpy reads src, not raw: raw has just been sent when the copy
	// starts, so its bytes would be in this core's cache, where the read's
	// source (the peer's memory, last read an iteration ago) is not. Like
	// the read's destination, the copy's is cleared before it is timed.
	raw, src, cp := make([]byte, most), make([]byte, most), make([]byte, most)
	for i := range raw {
		raw[i] = byte(i*7 + 1) // touched once, as memcpy's are
	}
	copy(src, raw)
	copy(cp, raw)
	for pi, pr := range pairs {
		n := int(pr.s) * pr.batch
		idx := 1<<20 + pi // the data's seed, apart from the sweep's
		if b.c.Rank() == 0 {
			b.fill(idx, b.region[:n])
		} else {
			b.fill(idx, b.expect[:n])
		}
		if err := b.c.Barrier(ctx); err != nil {
			return err
		}
		var ops []p2p.Op
		for o := range pr.batch {
			off := pageAt(o, pr.batch) * int(pr.s)
			ops = append(ops, p2p.Op{Local: b.local, LocalOff: off, Remote: b.remote, RemoteOff: off, Len: int(pr.s)})
		}
		var tRaw, tP2P, tCopy []float64
		var wrong int64
		transport := ""
		once := func(timed bool) error {
			// Raw: rank 1 sends, rank 0 receives and answers, as in TCP.
			l.arm()
			t0 := time.Now()
			var err error
			if n == 8 {
				err = l.pingPong(raw[:8], b.c.Rank() == 1)
			} else {
				err = l.oneway(raw[:n], b.c.Rank() == 1)
			}
			if err != nil {
				return err
			}
			dRaw := float64(time.Since(t0).Nanoseconds()) / 1e3
			if b.c.Rank() == 0 {
				return nil // the p2p read and the copy are rank 1's alone
			}
			clear(b.region[:n])
			t0 = time.Now()
			f := b.peer.Read(ops)
			if err := f.Wait(ctx); err != nil {
				return fmt.Errorf("%w: rank 1: paired read of %d × %s: %w", ErrP2PBench, pr.batch, bytesize.Format(pr.s), err)
			}
			dP2P := float64(time.Since(t0).Nanoseconds()) / 1e3
			transport = f.Transport()
			wrong += countWrongBytes(b.region[:n], b.expect[:n])
			clear(cp[:n])
			t0 = time.Now()
			copy(cp[:n], src[:n])
			dCopy := float64(time.Since(t0).Nanoseconds()) / 1e3
			if timed {
				tRaw, tP2P, tCopy = append(tRaw, dRaw), append(tP2P, dP2P), append(tCopy, dCopy)
			}
			return nil
		}
		t0 := time.Now()
		if err := once(false); err != nil {
			return err
		}
		both := make([]float64, 2)
		if err := collective.AllGatherOf(ctx, b.c, both, []float64{time.Since(t0).Seconds()}); err != nil {
			return err
		}
		iters := min(max(5, int(b.cfg.MinTime.Seconds()/max(both[0], both[1]))), b.cfg.MaxRounds)
		for range iters {
			if err := once(true); err != nil {
				return err
			}
		}
		rawOp := "oneway-paired"
		if n == 8 {
			rawOp = "pingpong-paired"
		}
		rows := []P2PResult{
			{Impl: "tcp", Transport: fmt.Sprintf("tcp-%d", ch), Op: rawOp, S: int64(n), Batch: 1, Concurrency: 1, Unchecked: true},
			{Impl: "p2p", Op: "read-paired", S: pr.s, Batch: pr.batch, Concurrency: 1},
			{Impl: "memcpy", Transport: "cpu", Op: "copy-paired", S: int64(n), Batch: 1, Concurrency: 1, Unchecked: true},
		}
		if n == 8 {
			rows = rows[:2]
			rows[0].Transport = "tcp-1" // one connection
		}
		for k, ts := range [][]float64{tRaw, tP2P, tCopy}[:len(rows)] {
			r := &rows[k]
			if b.c.Rank() == 0 {
				got, err := b.recvResult(ctx, *r)
				if err != nil {
					return err
				}
				*r = got
				continue
			}
			sort.Float64s(ts)
			r.P50, r.P99 = quantile(ts, 0.5), quantile(ts, 0.99)
			if r.Op != "pingpong-paired" { // a round trip of 8 bytes measures no bandwidth
				r.GBps = float64(n) / r.P50 / 1e3
			}
			if r.Impl == "p2p" {
				r.Transport, r.Wrong = transport, wrong
			}
			if err := b.sendResult(ctx, *r); err != nil {
				return err
			}
		}
		for _, r := range rows {
			emit(r)
		}
	}
	return nil
}

// pingPong sends 8 bytes and waits for them back (initiator), or echoes
// them, on the link's first connection.
func (l *link) pingPong(b []byte, initiator bool) error {
	c := l.conns[0]
	var err error
	if initiator {
		if _, err = c.Write(b); err == nil {
			_, err = io.ReadFull(c, b)
		}
	} else if _, err = io.ReadFull(c, b); err == nil {
		_, err = c.Write(b)
	}
	return l.fail("ping-pong", err)
}

// oneway sends buf striped evenly over the connections (sender), or
// receives it and acknowledges each stripe with a byte.
func (l *link) oneway(buf []byte, sender bool) error {
	k := len(l.conns)
	n := len(buf)
	for ch, conn := range l.conns {
		lo, hi := ch*n/k, (ch+1)*n/k
		rd := &l.readers[ch]
		go func() {
			var ack [1]byte
			var err error
			if sender {
				if _, err = conn.Write(buf[lo:hi]); err == nil {
					_, err = io.ReadFull(conn, ack[:])
				}
			} else if err = rd.ReadFull(buf[lo:hi]); err == nil {
				_, err = conn.Write(ack[:])
			}
			l.errs <- err
		}()
	}
	var first error
	for range k {
		if err := <-l.errs; err != nil && first == nil {
			first = err
		}
	}
	return l.fail("one-way transfer", first)
}

// CheckRegisterBytes says why n cannot be P2PConfig.RegisterBytes (nil
// when it can).
func CheckRegisterBytes(n int64) error {
	if n != 0 && (n%(4<<10) != 0 || n < 8<<10) {
		return errors.New("want 0 (none) or a multiple of 4 KiB, at least 8 KiB (timed as 4 KiB pages and as one region)")
	}
	return nil
}

// P2PWorld says why c's job cannot run P2P (nil when it can): two ranks
// measure a link.
func P2PWorld(c *collective.Communicator) error {
	if c.Size() != 2 {
		return fmt.Errorf("%w: two ranks measure a link; this job has %d (run it under slimerun --nproc-per-node 2, or --nnodes 2 with one rank each)", ErrP2PBench, c.Size())
	}
	return nil
}

// pageAt is where a batch's operation o of n lies, in pages of its size,
// in both regions: in descending order, so that no operation's memory
// follows the one before it. p2p writes and reads the pages of a batch
// that lie back to back as one piece (the path of a batch of one): a
// batch measures its pages scattered.
func pageAt(o, n int) int { return n - 1 - o }

func gib(n int64) float64 { return float64(n) / (1 << 30) }
