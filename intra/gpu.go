package intra

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/kernels"
	"github.com/slimego/slimego/rendezvous"
)

// GPUConfig describes one rank's membership in a node-local group of GPUs.
type GPUConfig struct {
	Store *rendezvous.Client
	Key   string // prefix of the group's keys in the store
	Rank  int    // local rank
	Size  int    // local ranks
	// Ranks maps local ranks to the global ranks that errors name.
	Ranks []int
	Dev   *device.GPU
	// Cap is the bytes of one block in each scratch slot; larger blocks go
	// in rounds (default DefaultGPUCap, less for more than 8 ranks).
	Cap int
	// Blocks bounds the thread blocks of one all-gather launch (default
	// 16): every rank's kernel must be resident at once, since each waits
	// for the others.
	Blocks  int
	Timeout time.Duration
}

// DefaultGPUCap is the default scratch block, 16 MiB, for up to 8 local
// ranks; beyond, it shrinks so that a rank's scratch (2 slots × ranks ×
// block) stays within 256 MiB, and no smaller than 64 KiB.
const DefaultGPUCap = 16 << 20

// GPUScratch is the scratch of a node of ranks ranks given cap (GPUConfig.Cap;
// <= 0: the default): what NewGPU allocates per block.
func GPUScratch(cap, ranks int) int {
	if cap <= 0 {
		return defaultCap(ranks)
	}
	return cap
}

func defaultCap(ranks int) int {
	return max(min(DefaultGPUCap, (256<<20)/(2*ranks)), 64<<10)
}

// GPUGroup is the node-local all-gather of the CUDA backend: the LL kernel
// of kernels/slime.cu. Every rank owns a region of device memory (scratch
// slots, flags, barrier flags) that every peer maps with CUDA IPC (or uses
// directly, for ranks in the same process), device counters that the
// kernels advance, and a status word in mapped host memory where a kernel
// that gives up says why.
type GPUGroup struct {
	cfg      GPUConfig
	lib      *kernels.Lib
	dev      int
	cap      uint64
	region   kernels.Ptr // this rank's: scratch, flags, barrier flags
	counters kernels.Ptr // epoch, sync[2], barrier epoch
	status   unsafe.Pointer
	statusD  kernels.Ptr
	peers    []kernels.Ptr // every rank's region, as this process addresses it
	opened   []bool        // mapped with IPC, to be closed
	broken   error
	symSeq   int
}

func (g *GPUGroup) flagsOff() uint64   { return align256(2 * uint64(g.cfg.Size) * g.cap) }
func (g *GPUGroup) barrierOff() uint64 { return g.flagsOff() + align256(kernels.FlagBytes(g.cfg.Size)) }
func (g *GPUGroup) regionBytes() uint64 {
	return g.barrierOff() + align256(8*uint64(g.cfg.Size))
}

func align256(n uint64) uint64 { return (n + 255) &^ 255 }

// exchange record: pid, device ordinal, region address, region bytes, IPC
// handle
const gpuRecord = 8 + 8 + 8 + 8 + kernels.IPCHandleBytes

// published holds the device memory that this process's GPU groups have
// published in the store, by device and address, with its size and the
// store key it was published under, until it is freed: a record that
// claims this process is accepted only where it names one of them,
// published under the same key (the store is not trusted with an
// address).
var published struct {
	sync.Mutex
	m map[localAlloc]pubAlloc
}

type pubAlloc struct {
	n   uint64
	key string
}

type localAlloc struct {
	dev int
	p   kernels.Ptr
}

func publish(dev int, p kernels.Ptr, n uint64, key string) {
	published.Lock()
	defer published.Unlock()
	if published.m == nil {
		published.m = make(map[localAlloc]pubAlloc)
	}
	published.m[localAlloc{dev, p}] = pubAlloc{n, key}
}

func unpublish(dev int, p kernels.Ptr) {
	published.Lock()
	defer published.Unlock()
	delete(published.m, localAlloc{dev, p})
}

func isPublished(dev int, p kernels.Ptr, n uint64, key string) bool {
	published.Lock()
	defer published.Unlock()
	got, ok := published.m[localAlloc{dev, p}]
	return ok && got == pubAlloc{n, key}
}

// NewGPU allocates this rank's region, exchanges it with the node's other
// ranks through the store and maps theirs.
func NewGPU(ctx context.Context, cfg GPUConfig) (g *GPUGroup, err error) {
	if cfg.Size < 1 || cfg.Size > kernels.MaxLocal || cfg.Rank < 0 || cfg.Rank >= cfg.Size {
		return nil, fault.New("init", cfg.Rank, -1, fault.ErrInvalid, "GPU group: local rank %d of %d (at most %d)", cfg.Rank, cfg.Size, kernels.MaxLocal)
	}
	if cfg.Cap <= 0 {
		cfg.Cap = defaultCap(cfg.Size)
	}
	if cfg.Blocks <= 0 {
		cfg.Blocks = 16
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Ranks == nil {
		cfg.Ranks = make([]int, cfg.Size)
		for i := range cfg.Ranks {
			cfg.Ranks[i] = i
		}
	}
	if len(cfg.Ranks) != cfg.Size {
		return nil, fault.New("init", cfg.Rank, -1, fault.ErrInvalid, "GPU group: %d global ranks for %d local ranks", len(cfg.Ranks), cfg.Size)
	}
	// The cleanup holds the group itself: the error returns set g to nil.
	self := &GPUGroup{cfg: cfg, lib: cfg.Dev.Lib(), dev: cfg.Dev.Ordinal, cap: align256(uint64(cfg.Cap))}
	g = self
	defer func() {
		if err != nil {
			// Tell the node's other ranks at once rather than letting them
			// wait for this rank's memory until the timeout.
			cfg.Store.Set(ctx, self.recordKey("region", cfg.Rank), []byte("error: "+err.Error()))
			self.release()
		}
	}()
	if g.region, err = g.lib.Malloc(g.dev, g.regionBytes()); err != nil {
		return nil, g.fail("init", err)
	}
	if err = g.lib.Memset(g.dev, g.region, 0, g.regionBytes()); err != nil {
		return nil, g.fail("init", err)
	}
	if g.counters, err = g.lib.Malloc(g.dev, kernels.CounterBytes); err != nil {
		return nil, g.fail("init", err)
	}
	if err = g.lib.Memset(g.dev, g.counters, 0, kernels.CounterBytes); err != nil {
		return nil, g.fail("init", err)
	}
	if g.status, g.statusD, err = g.lib.HostAlloc(g.dev, 64); err != nil {
		return nil, g.fail("init", err)
	}
	// The kernels are loaded now, before the exchange lets any peer
	// launch: under CUDA's lazy module loading a kernel's first launch
	// waits for every stream of the device, and a peer's kernel spinning
	// there for this rank would hold it until the kernel's timeout.
	if err = g.lib.PreloadKernels(g.dev); err != nil {
		return nil, g.fail("init", err)
	}
	if g.peers, g.opened, err = g.exchange(ctx, "region", g.region, g.regionBytes()); err != nil {
		return nil, err
	}
	return g, nil
}

// exchange publishes this rank's allocation p of n bytes under name and
// maps every peer's: directly for ranks in this process, with CUDA IPC for
// the others. A peer's record is not trusted: its allocation must be of n
// bytes too (ErrSizeMismatch), and one that claims this process must name
// an allocation that a rank of this group in this process published under
// name (ErrInvalid).
// An in-process peer on another GPU needs peer access from this rank's
// device to its own (memory mapped with IPC has it already): exchange
// enables it, since a kernel touching the peer's memory would fault
// otherwise. It returns once every local rank has mapped everyone's, so
// that no kernel writes into memory a peer has not mapped yet.
func (g *GPUGroup) exchange(ctx context.Context, name string, p kernels.Ptr, n uint64) (peers []kernels.Ptr, opened []bool, err error) {
	// The peers' records are waited for within the group's Timeout as well
	// as ctx's deadline.
	ctx, cancel := context.WithTimeout(ctx, g.cfg.Timeout)
	defer cancel()
	cfg := g.cfg
	peers, opened = make([]kernels.Ptr, cfg.Size), make([]bool, cfg.Size)
	defer func() {
		if err != nil {
			for r, ok := range opened {
				if ok {
					g.lib.IPCClose(g.dev, peers[r])
				}
			}
		}
	}()
	h, err := g.lib.IPCHandle(g.dev, p)
	if err != nil {
		return nil, nil, g.fail("init", err)
	}
	rec := make([]byte, gpuRecord)
	binary.LittleEndian.PutUint64(rec, uint64(os.Getpid()))
	binary.LittleEndian.PutUint64(rec[8:], uint64(g.dev))
	binary.LittleEndian.PutUint64(rec[16:], uint64(p))
	binary.LittleEndian.PutUint64(rec[24:], n)
	copy(rec[32:], h[:])
	publish(g.dev, p, n, g.recordKey(name, 0))
	key := func(r int) string { return g.recordKey(name, r) }
	if err := cfg.Store.Set(ctx, key(cfg.Rank), rec); err != nil {
		return nil, nil, g.fail("init", err)
	}
	me := cfg.Ranks[cfg.Rank]
	for r := 0; r < cfg.Size; r++ {
		if r == cfg.Rank {
			peers[r] = p
			continue
		}
		v, err := cfg.Store.Get(ctx, key(r))
		if err != nil {
			return nil, nil, fault.New("init", me, cfg.Ranks[r], fault.ErrTimeout, "waiting for the peer's GPU memory handle: %v", err)
		}
		if msg, ok := strings.CutPrefix(string(v), "error: "); ok {
			return nil, nil, fault.New("init", me, cfg.Ranks[r], fault.ErrPeerLost, "the peer could not set up its GPU memory: %s", msg)
		}
		if len(v) != gpuRecord {
			return nil, nil, fault.New("init", me, cfg.Ranks[r], fault.ErrInvalid, "GPU memory record of %d bytes", len(v))
		}
		if pn := binary.LittleEndian.Uint64(v[24:]); pn != n {
			return nil, nil, fault.New("init", me, cfg.Ranks[r], fault.ErrSizeMismatch, "the peer's GPU memory %s is %d bytes, this rank's %d (its Cap or size differs)", name, pn, n)
		}
		if binary.LittleEndian.Uint64(v) == uint64(os.Getpid()) {
			// Same address space: the pointer as it is, reachable from
			// this rank's GPU once peer access is on; only one that a
			// rank of this group in this process published.
			pd, pp := binary.LittleEndian.Uint64(v[8:]), kernels.Ptr(binary.LittleEndian.Uint64(v[16:]))
			if pd > math.MaxInt32 || !isPublished(int(pd), pp, n, g.recordKey(name, 0)) || int(pd) == g.dev && pp == p {
				return nil, nil, fault.New("init", me, cfg.Ranks[r], fault.ErrInvalid, "the peer's record names GPU %d memory at %#x of %d bytes in this process, which no rank of this group published", pd, uint64(pp), n)
			}
			if pd := int(pd); pd != g.dev {
				if err := g.lib.EnablePeerAccess(g.dev, pd); err != nil {
					return nil, nil, fault.New("init", me, cfg.Ranks[r], fault.ErrInvalid, "enabling peer access from GPU %d to the peer's GPU %d: %v", g.dev, pd, err)
				}
			}
			peers[r] = pp
			continue
		}
		var ph [kernels.IPCHandleBytes]byte
		copy(ph[:], v[32:])
		q, err := g.lib.IPCOpen(g.dev, ph)
		if err != nil {
			return nil, nil, fault.New("init", me, cfg.Ranks[r], fault.ErrPeerLost, "mapping the peer's GPU memory with CUDA IPC: %v", err)
		}
		peers[r], opened[r] = q, true // closed on error by the deferred cleanup
		// The handle is not trusted either: the allocation it maps must
		// hold the n bytes the record claims, or the kernels would write
		// past its end.
		base, size, err := g.lib.MemRange(g.dev, q)
		if err != nil {
			return nil, nil, fault.New("init", me, cfg.Ranks[r], fault.ErrInvalid, "the allocation the peer's GPU memory handle maps: %v", err)
		}
		if base != q || size < n {
			return nil, nil, fault.New("init", me, cfg.Ranks[r], fault.ErrInvalid, "the peer's GPU memory handle maps %d bytes at %#x, its record claims %d at %#x", size, uint64(base), n, uint64(q))
		}
	}
	if err := cfg.Store.Barrier(ctx, cfg.Key+"/gpu/"+name+"/mapped", cfg.Rank, cfg.Size); err != nil {
		return nil, nil, fault.New("init", me, -1, fault.ErrTimeout, "waiting for the node's ranks to map GPU memory: %v", err)
	}
	// Every rank has read every record before it reached the barrier: this
	// rank's record is read no more. (The barrier's own keys go later, in
	// doneWith: a rank may still be waiting on them.)
	cfg.Store.Delete(ctx, key(cfg.Rank))
	return peers, opened, nil
}

// doneWith deletes the keys of barriers (each named as for
// Client.Barrier) once every rank is past them all: each rank counts
// itself under count after its last barrier of the set, and the rank whose
// count reaches the group's size, knowing that no rank waits on those keys
// any more, deletes them and the count. So the store, whose keys are
// limited, does not fill up over a long job's allocations.
func (g *GPUGroup) doneWith(ctx context.Context, count string, barriers ...string) {
	st := g.cfg.Store
	n, err := st.Add(ctx, count, 1)
	if err != nil || int(n) != g.cfg.Size {
		return
	}
	for _, b := range barriers {
		for _, k := range rendezvous.BarrierKeys(b, g.cfg.Size) {
			st.Delete(ctx, k)
		}
	}
	st.Delete(ctx, count)
}

func (g *GPUGroup) recordKey(name string, r int) string {
	return g.cfg.Key + "/gpu/" + name + "/" + strconv.Itoa(r)
}

// GPUSymmetric is device memory that every rank of the node has mapped:
// Peers[r] is local rank r's allocation as this rank addresses it.
type GPUSymmetric struct {
	g      *GPUGroup
	name   string
	Peers  []kernels.Ptr
	Bytes  int
	opened []bool
}

// Local is this rank's own allocation.
func (s *GPUSymmetric) Local() kernels.Ptr { return s.Peers[s.g.cfg.Rank] }

// AllocSymmetric allocates n bytes on every rank of the node (a collective
// call) and maps everyone's.
func (g *GPUGroup) AllocSymmetric(ctx context.Context, n int) (*GPUSymmetric, error) {
	g.symSeq++
	name := "sym" + strconv.Itoa(g.symSeq)
	p, err := g.lib.Malloc(g.dev, uint64(n))
	if err != nil {
		return nil, g.fail("alloc", err)
	}
	peers, opened, err := g.exchange(ctx, name, p, uint64(n))
	if err != nil {
		unpublish(g.dev, p)
		g.lib.Free(g.dev, p)
		return nil, err
	}
	return &GPUSymmetric{g: g, name: name, Peers: peers, Bytes: n, opened: opened}, nil
}

// Free unmaps the peers' allocations and frees this rank's, once every
// rank of the node has come to free it (bounded by ctx).
func (s *GPUSymmetric) Free(ctx context.Context) error {
	if s.Peers == nil {
		return nil
	}
	g := s.g
	err := g.cfg.Store.Barrier(ctx, g.cfg.Key+"/gpu/"+s.name+"/freed", g.cfg.Rank, g.cfg.Size)
	if err == nil {
		b := g.cfg.Key + "/gpu/" + s.name
		g.doneWith(ctx, b+"/done", b+"/mapped", b+"/freed")
	}
	for r, ok := range s.opened {
		if ok {
			g.lib.IPCClose(g.dev, s.Peers[r])
		}
	}
	unpublish(g.dev, s.Local())
	g.lib.Free(g.dev, s.Local())
	s.Peers = nil
	return err
}

func (g *GPUGroup) fail(op string, err error) error {
	return &fault.OpError{Op: op, Rank: g.cfg.Ranks[g.cfg.Rank], Peer: -1, Err: err}
}

// GPUPlan is a planned all-gather on the GPU: one kernel launch per round.
type GPUPlan struct {
	g      *GPUGroup
	rounds []kernels.AllGatherArgs
	blocks int
}

// Plan prepares an all-gather of the node's blocks: local rank s's
// sizes[s] bytes land at dst+offs[s]; src holds this rank's block. dst and
// src are device addresses on this rank's GPU; they need not be symmetric.
func (g *GPUGroup) Plan(dst, src kernels.Ptr, sizes, offs []int) (*GPUPlan, error) {
	n := g.cfg.Size
	if len(sizes) != n || len(offs) != n {
		return nil, fault.New("allgather", g.cfg.Ranks[g.cfg.Rank], -1, fault.ErrInvalid, "%d sizes and %d offsets for %d local ranks", len(sizes), len(offs), n)
	}
	most := 0
	for _, s := range sizes {
		most = max(most, s)
	}
	nr := max(1, (most+int(g.cap)-1)/int(g.cap))
	p := &GPUPlan{g: g, rounds: make([]kernels.AllGatherArgs, nr)}
	clamp := func(size, j int) uint64 {
		return uint64(min(max(size-j*int(g.cap), 0), int(g.cap)))
	}
	timeout := uint64(g.cfg.Timeout.Nanoseconds())
	for j := range p.rounds {
		a := &p.rounds[j]
		a.Rank, a.NRanks = int32(g.cfg.Rank), int32(n)
		a.Cap = g.cap
		a.Bytes = clamp(sizes[g.cfg.Rank], j)
		a.Src = src + kernels.Ptr(j)*kernels.Ptr(g.cap)
		a.Total = uint64(sizes[g.cfg.Rank])
		a.Dst = dst
		for s := 0; s < n; s++ {
			a.Off[s] = uint64(offs[s]) + uint64(j)*g.cap
			a.Expect[s] = clamp(sizes[s], j)
			a.Totals[s] = uint64(sizes[s])
			a.Scratch[s] = g.peers[s]
			a.Flags[s] = g.peers[s] + kernels.Ptr(g.flagsOff())
		}
		a.Epoch, a.Sync = g.counters, g.counters+8
		a.Status = g.statusD
		a.TimeoutNS = timeout
	}
	// About 64 KiB per block, within the configured bound.
	p.blocks = min(max(1, int(min(uint64(most), g.cap))>>16), g.cfg.Blocks)
	return p, nil
}

// Launch enqueues the plan's kernels on s (graph-capturable).
func (p *GPUPlan) Launch(s *device.CUDAStream) error {
	for j := range p.rounds {
		if err := p.g.lib.AllGatherLL(p.g.dev, &p.rounds[j], p.blocks, s.H); err != nil {
			return p.g.fail("allgather", err)
		}
	}
	return nil
}

// BarrierArgs are the arguments of the node's flag barrier kernel, for
// schedules that pull from peers' memory with copies.
func (g *GPUGroup) BarrierArgs() *kernels.BarrierArgs {
	a := &kernels.BarrierArgs{Rank: int32(g.cfg.Rank), NRanks: int32(g.cfg.Size)}
	for s := range g.peers {
		a.Flags[s] = g.peers[s] + kernels.Ptr(g.barrierOff())
	}
	a.Epoch = g.counters + 24
	a.Status = g.statusD
	a.TimeoutNS = uint64(g.cfg.Timeout.Nanoseconds())
	return a
}

// Check reads the status word after the work synchronized: a kernel that
// gave up (a peer that did not arrive, announced another size, or ran on
// past a failure of its own, lapping this rank) is an error naming the
// peer, and the group is broken from then on, since its
// peers' epochs may no longer match.
func (g *GPUGroup) Check(op string) error {
	if g.broken != nil {
		return g.broken
	}
	w := atomic.LoadInt32((*int32)(g.status))
	if w == 0 {
		return nil
	}
	src := int(w >> 8)
	peer := -1
	if src >= 0 && src < len(g.cfg.Ranks) {
		peer = g.cfg.Ranks[src]
	}
	me := g.cfg.Ranks[g.cfg.Rank]
	switch w & 0xff {
	case kernels.StatusTimeout:
		g.broken = fault.New(op, me, peer, fault.ErrTimeout, "the GPU kernel waited %v for the peer's block", g.cfg.Timeout)
	case kernels.StatusSize:
		g.broken = fault.New(op, me, peer, fault.ErrSizeMismatch, "the peer announced a block of another size, or went on past a failure of its own; the communicator must be closed")
	default:
		g.broken = fault.New(op, me, peer, fault.ErrClosed, "GPU status word %#x", w)
	}
	return g.broken
}

// Close waits (bounded by ctx) until every rank of the node closes, so that
// no kernel still writes into memory being freed, then releases it.
func (g *GPUGroup) Close(ctx context.Context) error {
	var err error
	if g.cfg.Store != nil {
		if e := g.cfg.Store.Barrier(ctx, g.cfg.Key+"/gpu/closed", g.cfg.Rank, g.cfg.Size); e != nil && !errors.Is(e, context.Canceled) {
			err = fmt.Errorf("intra: closing the GPU group: %w", e)
		} else if e == nil {
			b := g.cfg.Key + "/gpu/"
			g.doneWith(ctx, b+"region/done", b+"region/mapped", b+"closed")
		}
	}
	g.release()
	return err
}

func (g *GPUGroup) release() {
	for r, ok := range g.opened {
		if ok {
			g.lib.IPCClose(g.dev, g.peers[r])
			g.opened[r] = false
		}
	}
	if g.region != 0 {
		unpublish(g.dev, g.region)
		g.lib.Free(g.dev, g.region)
		g.region = 0
	}
	if g.counters != 0 {
		g.lib.Free(g.dev, g.counters)
		g.counters = 0
	}
	if g.status != nil {
		g.lib.HostFree(g.dev, g.status)
		g.status = nil
	}
}
