package intra

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/internal/teststore"
	"github.com/slimego/slimego/kernels"
	"github.com/slimego/slimego/rendezvous"
	"golang.org/x/sys/unix"
)

// Tests that kill survivors of `make mutate MUTATE=intra` (docs/MUTATION.md):
// the defaults and bounds of the GPU and shared-memory groups, which peer a
// GPU status word names, and what a group tells after it is closed.

// TestDefaultCap: the GPU scratch block is 16 MiB up to 8 ranks, keeps
// 2 slots × ranks × block within 256 MiB beyond, and is never under 64 KiB.
func TestDefaultCap(t *testing.T) {
	for _, tc := range []struct{ ranks, want int }{
		{1, 16 << 20},
		{8, 16 << 20},
		{9, (256 << 20) / 18},
		{16, 8 << 20},
		{64, 2 << 20},
		{2048, 64 << 10},
		{4096, 64 << 10},
	} {
		if got := defaultCap(tc.ranks); got != tc.want {
			t.Errorf("defaultCap(%d) = %d, want %d", tc.ranks, got, tc.want)
		}
		if tc.ranks <= 2048 && 2*tc.ranks*defaultCap(tc.ranks) > 256<<20 {
			t.Errorf("%d ranks: scratch of %d bytes exceeds 256 MiB", tc.ranks, 2*tc.ranks*defaultCap(tc.ranks))
		}
	}
}

// TestGPURegionLayout: a GPU region holds its scratch slots, its flags and
// one 8-byte barrier flag per rank, each part inside the allocation.
func TestGPURegionLayout(t *testing.T) {
	for size := 1; size <= kernels.MaxLocal; size++ {
		g := &GPUGroup{cfg: GPUConfig{Size: size}, cap: 4096}
		if g.flagsOff() < 2*uint64(size)*g.cap {
			t.Fatalf("%d ranks: flags at %d overlap the scratch", size, g.flagsOff())
		}
		if g.barrierOff() < g.flagsOff()+kernels.FlagBytes(size) {
			t.Fatalf("%d ranks: barrier flags at %d overlap the flags", size, g.barrierOff())
		}
		if g.regionBytes() < g.barrierOff()+8*uint64(size) {
			t.Fatalf("%d ranks: region of %d bytes ends before its barrier flags (%d + %d)", size, g.regionBytes(), g.barrierOff(), 8*size)
		}
	}
}

// TestGPUPlanRoundCount: a block of exactly the scratch size is one round,
// one byte more is two, and empty blocks are one.
func TestGPUPlanRoundCount(t *testing.T) {
	for _, tc := range []struct {
		sizes  []int
		rounds int
	}{
		{[]int{256, 256}, 1},
		{[]int{0, 257}, 2},
		{[]int{0, 0}, 1},
		{[]int{512, 1}, 2},
	} {
		g := &GPUGroup{cfg: GPUConfig{Rank: 0, Size: 2, Ranks: []int{0, 1}, Blocks: 16}, cap: 256, peers: make([]kernels.Ptr, 2)}
		p, err := g.Plan(0, 0, tc.sizes, []int{0, 1024})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.rounds) != tc.rounds {
			t.Errorf("sizes %v, scratch 256: %d rounds, want %d", tc.sizes, len(p.rounds), tc.rounds)
		}
	}
}

// TestGPUCheckNamesPeer: a kernel's status word names the local rank that
// it gave up on; Check reports that rank's global rank, and no peer (-1)
// for a word whose rank is outside the group.
func TestGPUCheckNamesPeer(t *testing.T) {
	for _, tc := range []struct {
		src  int32
		peer int
	}{
		{0, 5}, {1, 6}, {2, -1}, {3, -1}, {200, -1}, {-1, -1},
	} {
		w := tc.src<<8 | kernels.StatusTimeout
		g := &GPUGroup{cfg: GPUConfig{Rank: 1, Size: 2, Ranks: []int{5, 6}, Timeout: time.Second}, status: unsafe.Pointer(&w)}
		err := g.Check("allgather")
		var oe *fault.OpError
		if !errors.As(err, &oe) || !errors.Is(err, fault.ErrTimeout) || oe.Rank != 6 || oe.Peer != tc.peer {
			t.Errorf("status word of local rank %d: want ErrTimeout of rank 6 naming peer %d, got %v", tc.src, tc.peer, err)
		}
	}
}

// TestNewGPUArguments: NewGPU refuses ranks outside [0, Size) and sizes
// outside [1, kernels.MaxLocal]; it accepts the bounds themselves; it fills
// in the defaults of Blocks, Timeout and Cap and keeps what is set; Close
// frees and forgets every allocation of the group.
func TestNewGPUArguments(t *testing.T) {
	dev, err := device.OpenGPU(0)
	if err != nil {
		t.Fatal(err)
	}
	errs := teststore.Run(t, 1, 60*time.Second, func(ctx context.Context, st *rendezvous.Client, _ int) error {
		for _, c := range []struct{ rank, size int }{{0, 0}, {-1, 2}, {2, 2}, {3, 2}, {0, kernels.MaxLocal + 1}} {
			g, err := NewGPU(ctx, GPUConfig{Store: st, Key: fmt.Sprintf("bad%d.%d", c.rank, c.size), Rank: c.rank, Size: c.size, Dev: dev, Cap: 4096, Timeout: time.Second})
			if !errors.Is(err, fault.ErrInvalid) {
				if g != nil {
					g.Close(ctx)
				}
				return fmt.Errorf("rank %d of %d: want ErrInvalid, got %v", c.rank, c.size, err)
			}
		}
		// One rank, defaults.
		g, err := NewGPU(ctx, GPUConfig{Store: st, Key: "one", Rank: 0, Size: 1, Dev: dev})
		if err != nil {
			return fmt.Errorf("a group of one rank: %v", err)
		}
		if g.cfg.Blocks != 16 || g.cfg.Timeout != DefaultTimeout || g.cfg.Cap != defaultCap(1) {
			g.Close(ctx)
			return fmt.Errorf("defaults: Blocks %d, Timeout %v, Cap %d", g.cfg.Blocks, g.cfg.Timeout, g.cfg.Cap)
		}
		if err := g.Close(ctx); err != nil {
			return err
		}
		if g.region != 0 || g.counters != 0 || g.status != nil {
			return fmt.Errorf("after Close: region %#x, counters %#x, status %p still held", g.region, g.counters, g.status)
		}
		// One rank, settings kept.
		g, err = NewGPU(ctx, GPUConfig{Store: st, Key: "set", Rank: 0, Size: 1, Dev: dev, Blocks: 3, Timeout: 7 * time.Second, Cap: 4096})
		if err != nil {
			return err
		}
		defer g.Close(ctx)
		if g.cfg.Blocks != 3 || g.cfg.Timeout != 7*time.Second || g.cfg.Cap != 4096 {
			return fmt.Errorf("settings: Blocks %d, Timeout %v, Cap %d", g.cfg.Blocks, g.cfg.Timeout, g.cfg.Cap)
		}
		return nil
	})
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	// The largest group is accepted.
	errs = teststore.Run(t, kernels.MaxLocal, 60*time.Second, func(ctx context.Context, st *rendezvous.Client, r int) error {
		g, err := NewGPU(ctx, GPUConfig{Store: st, Key: "most", Rank: r, Size: kernels.MaxLocal, Dev: dev, Cap: 256, Timeout: 20 * time.Second})
		if err != nil {
			return err
		}
		return g.Close(ctx)
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("a group of %d ranks, rank %d: %v", kernels.MaxLocal, r, err)
		}
	}
}

// TestNewArguments: New refuses a rank outside [0, Size) at once.
func TestNewArguments(t *testing.T) {
	errs := teststore.Run(t, 1, 20*time.Second, func(ctx context.Context, st *rendezvous.Client, _ int) error {
		for _, c := range []struct{ rank, size int }{{0, 0}, {-1, 2}, {2, 2}, {1, 1}} {
			short, cancel := context.WithTimeout(ctx, 2*time.Second)
			g, err := New(short, Config{Store: st, Key: fmt.Sprintf("bad%d.%d", c.rank, c.size), ShmPrefix: fmt.Sprintf("slimego-test-%d-", os.Getpid()), Rank: c.rank, Size: c.size})
			cancel()
			if !errors.Is(err, fault.ErrInvalid) {
				if g != nil {
					g.Close()
				}
				return fmt.Errorf("rank %d of %d: want ErrInvalid, got %v", c.rank, c.size, err)
			}
		}
		return nil
	})
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
}

// TestNewDefaults: New fills in every zero setting (a ctx without deadline
// is bounded by the default Timeout, not by a zero one) and keeps what is
// set.
func TestNewDefaults(t *testing.T) {
	prefix := fmt.Sprintf("slimego-test-%d-", os.Getpid())
	errs := teststore.Run(t, 1, 60*time.Second, func(_ context.Context, st *rendezvous.Client, _ int) error {
		g, err := New(context.Background(), Config{Store: st, Key: "zero", ShmPrefix: prefix, Rank: 0, Size: 1})
		if err != nil {
			return fmt.Errorf("defaults: %v", err)
		}
		c := g.cfg
		spin := 50 * time.Microsecond
		if g.oversb {
			spin = time.Millisecond
		}
		g.Close()
		if c.Timeout != DefaultTimeout || c.SlotBytes != DefaultSlotBytes || c.Slots != DefaultSlots ||
			c.ZeroCopyMin != DefaultZeroCopyMin || c.CMAMin != DefaultCMAMin || c.BigCopy != DefaultBigCopy || g.spin != spin {
			return fmt.Errorf("defaults: %+v, spin %v (want %v)", c, g.spin, spin)
		}
		set := Config{Store: st, Key: "set", ShmPrefix: prefix, Rank: 0, Size: 1, Timeout: 9 * time.Second,
			SlotBytes: lineBytes, Slots: 2, ZeroCopyMin: 77, CMAMin: 99, BigCopy: 12345, SpinTime: 7 * time.Microsecond}
		g, err = New(context.Background(), set)
		if err != nil {
			return fmt.Errorf("settings: %v", err)
		}
		c = g.cfg
		g.Close()
		if c.Timeout != set.Timeout || c.SlotBytes != set.SlotBytes || c.Slots != set.Slots || c.ZeroCopyMin != set.ZeroCopyMin ||
			c.CMAMin != set.CMAMin || c.BigCopy != set.BigCopy || g.spin != set.SpinTime {
			return fmt.Errorf("settings: %+v, spin %v", c, g.spin)
		}
		return nil
	})
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
}

// TestNewCMA: ranks use cross-memory attach exactly when every rank can
// read every peer's memory with it (process_vm_readv may be refused, in a
// container) and CMAMin is not negative.
func TestNewCMA(t *testing.T) {
	for _, cmaMin := range []int{0, -1} {
		errs := group(t, 2, Config{Timeout: 20 * time.Second, CMAMin: cmaMin}, func(g *Group) error {
			// Probe again while every rank is still in the group.
			allowed := g.probeCMA()
			if err := g.Barrier(context.Background()); err != nil {
				return err
			}
			if want := cmaMin >= 0 && allowed; g.cma != want {
				return fmt.Errorf("CMAMin %d, process_vm_readv allowed %v: cma %v, want %v", cmaMin, allowed, g.cma, want)
			}
			return nil
		})
		for r, err := range errs {
			if err != nil {
				t.Errorf("rank %d: %v", r, err)
			}
		}
	}
}

// TestWatchPeersInProcess: peers in this process get no pidfd; ranks
// oversubscribe when they outnumber the CPUs or the runtime's processors;
// waits yield to goroutines when ranks share the process or the runtime has
// one processor.
func TestWatchPeersInProcess(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	type want struct{ oversb, goYield bool }
	check := func(L, procs int, w want) {
		t.Helper()
		runtime.GOMAXPROCS(procs)
		errs := group(t, L, Config{Timeout: 30 * time.Second}, func(g *Group) error {
			for p, fd := range g.pidfds {
				if fd != -1 {
					return fmt.Errorf("in-process peer %d has pidfd %d", p, fd)
				}
			}
			if g.oversb != w.oversb || g.goYield != w.goYield {
				return fmt.Errorf("%d ranks, GOMAXPROCS %d, %d CPUs: oversb %v goYield %v, want %v %v", L, procs, runtime.NumCPU(), g.oversb, g.goYield, w.oversb, w.goYield)
			}
			return nil
		})
		for r, err := range errs {
			if err != nil {
				t.Errorf("rank %d: %v", r, err)
			}
		}
	}
	cpus := runtime.NumCPU()
	check(1, 2, want{oversb: 1 > cpus, goYield: false})
	check(1, 1, want{oversb: 1 > cpus, goYield: true})
	check(2, 2, want{oversb: 2 > cpus, goYield: true})
	check(2, 1, want{oversb: true, goYield: true})
	if cpus <= 64 {
		check(cpus, cpus, want{oversb: false, goYield: true})
		check(cpus+1, cpus+1, want{oversb: true, goYield: true})
	}
}

// TestClosedGroupIsClosed: every call on a closed group is ErrClosed naming
// the rank and no peer.
func TestClosedGroupIsClosed(t *testing.T) {
	errs := group(t, 1, Config{Timeout: 20 * time.Second, Ranks: []int{4}}, func(g *Group) error {
		g.Close()
		err := g.Barrier(context.Background())
		var oe *fault.OpError
		if !errors.Is(err, fault.ErrClosed) || !errors.As(err, &oe) || oe.Rank != 4 || oe.Peer != -1 {
			return fmt.Errorf("Barrier after Close: want ErrClosed of rank 4 naming no peer, got %v", err)
		}
		return nil
	})
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
}

// TestSingleRankSweepsOrphans: local rank 0 sweeps /dev/shm when it is the
// group's only rank too.
func TestSingleRankSweepsOrphans(t *testing.T) {
	const gonePID = 1<<22 + 3 // above every pid_max Linux allows
	orphan := filepath.Join("/dev/shm", fmt.Sprintf("slimego-testorphan1-%d-seg-o%d.5-0123456789ab", os.Getpid(), gonePID))
	if err := os.WriteFile(orphan, []byte("left"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(orphan) })
	errs := group(t, 1, Config{Timeout: 20 * time.Second}, func(g *Group) error { return nil })
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	if _, err := os.Stat(orphan); err == nil {
		t.Errorf("orphan %s not removed by a group of one rank", orphan)
	}
}

// TestSegmentErrorsNameNoPeer: when rank 0 cannot create a segment, or
// cannot publish its name, its error names no peer: nobody else failed.
func TestSegmentErrorsNameNoPeer(t *testing.T) {
	errs := group(t, 1, Config{Timeout: 20 * time.Second}, func(g *Group) error {
		_, err := g.Alloc(context.Background(), 1<<50)
		var oe *fault.OpError
		if !errors.As(err, &oe) || oe.Rank != 0 || oe.Peer != -1 {
			return fmt.Errorf("segment too large: want an error of rank 0 naming no peer, got %v", err)
		}
		return nil
	})
	if errs[0] != nil {
		t.Fatal(errs[0])
	}

	addr := teststore.Serve(t, rendezvous.ServerConfig{MaxKeys: 50})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := rendezvous.Dial(ctx, addr, rendezvous.Auth{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	g, err := New(ctx, Config{Store: st, Key: "t", ShmPrefix: fmt.Sprintf("slimego-test-%d-", os.Getpid()), Rank: 0, Size: 1, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for i := 0; st.Set(ctx, fmt.Sprintf("fill/%d", i), nil) == nil; i++ {
		if i > 100 {
			t.Fatal("the store takes more keys than its limit")
		}
	}
	_, err = g.Alloc(ctx, 64)
	var oe *fault.OpError
	if !errors.As(err, &oe) || oe.Rank != 0 || oe.Peer != -1 {
		t.Errorf("name not published: want an error of rank 0 naming no peer, got %v", err)
	}
}

// TestRoundUp: roundUp gives the least multiple of m not below n.
func TestRoundUp(t *testing.T) {
	for _, tc := range []struct{ n, m, want int }{
		{0, 64, 0}, {1, 64, 64}, {63, 64, 64}, {64, 64, 64}, {65, 64, 128}, {4095, 4096, 4096}, {8192, 4096, 8192}, {7, 1, 7},
	} {
		if got := roundUp(tc.n, tc.m); got != tc.want {
			t.Errorf("roundUp(%d, %d) = %d, want %d", tc.n, tc.m, got, tc.want)
		}
	}
}

// TestIdentityExactLength: an identity reads back from exactly
// identityBytes bytes; one byte fewer is refused.
func TestIdentityExactLength(t *testing.T) {
	want := identity{kind: kindBuffer, a: 3, b: 4, c: 5, job: 0x1234, total: 1 << 20}
	mem := make([]byte, identityBytes)
	want.write(mem)
	if got, err := readIdentity(mem); err != nil || got != want {
		t.Errorf("read %+v, %v from %d bytes; want %+v", got, err, len(mem), want)
	}
	if _, err := readIdentity(mem[:identityBytes-1]); err == nil {
		t.Errorf("an identity read from %d bytes", identityBytes-1)
	}
}

// TestMemoryBounds: the Memory models refuse copies into less room and
// slices outside their span, and accept the bounds themselves.
func TestMemoryBounds(t *testing.T) {
	h := HostMem{}
	if err := h.Copy(make([]byte, 4), make([]byte, 4), time.Time{}); err != nil {
		t.Errorf("HostMem: a copy of 4 bytes into 4: %v", err)
	}
	if err := h.Copy(make([]byte, 4), make([]byte, 5), time.Time{}); err == nil {
		t.Error("HostMem: a copy of 5 bytes into 4 accepted")
	}
	one := []byte{1, 2}
	if !h.Same(one, one[:1]) || h.Same(one[:0], one) || h.Same(one, one[:0]) || h.Same(one, one[1:]) {
		t.Error("HostMem.Same: wrong for a slice and itself, an empty slice or another start")
	}

	dev, err := device.OpenGPU(0)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewGPUMem(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer m.S.Close()
	buf, err := dev.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	span := Span(buf)
	if !m.Same(span, m.Slice(span, 0, 1)) || m.Same(m.Slice(span, 0, 0), span) || m.Same(span, m.Slice(span, 0, 0)) || m.Same(span, m.Slice(span, 1, 1)) {
		t.Error("GPUMem.Same: wrong for a span and itself, an empty span or another start")
	}
	if s := m.Slice(span, 60, 4); s.Ptr != span.Ptr+60 || s.N != 4 {
		t.Errorf("Slice(60, 4) = %+v", s)
	}
	for _, c := range []struct{ off, n int }{{-1, 1}, {0, -1}, {61, 4}, {0, 65}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Slice(%d, %d) of 64 bytes did not panic", c.off, c.n)
				}
			}()
			m.Slice(span, c.off, c.n)
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	in := []byte("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
	if err := m.CopyIn(span, in, deadline); err != nil {
		t.Errorf("CopyIn of 64 bytes into 64: %v", err)
	}
	if err := m.CopyIn(span, make([]byte, 65), deadline); err == nil {
		t.Error("CopyIn of 65 bytes into 64 accepted")
	}
	if err := m.Copy(m.Slice(span, 0, 32), m.Slice(span, 32, 32), deadline); err != nil {
		t.Errorf("Copy of 32 bytes into 32: %v", err)
	}
	if err := m.Copy(m.Slice(span, 0, 32), m.Slice(span, 31, 33), deadline); err == nil {
		t.Error("Copy of 33 bytes into 32 accepted")
	}
	if err := m.Copy(m.Slice(span, 0, 0), m.Slice(span, 5, 0), deadline); err != nil {
		t.Errorf("Copy of nothing: %v", err)
	}
	out := make([]byte, 64)
	if err := m.CopyOut(out, span, deadline); err != nil {
		t.Errorf("CopyOut of 64 bytes out of 64: %v", err)
	}
	if want := string(in[32:]) + string(in[32:]); string(out) != want {
		t.Errorf("after the copies: %q, want %q", out, want)
	}
	if err := m.CopyOut(make([]byte, 65), span, deadline); err == nil {
		t.Error("CopyOut of 65 bytes out of 64 accepted")
	}
}

// TestGPUNodeSetBounds: a GPU node's plan refuses a source that is not this
// rank's block and blocks outside the destination, and accepts a block that
// ends exactly at the destination's end.
func TestGPUNodeSetBounds(t *testing.T) {
	g := &GPUGroup{cfg: GPUConfig{Rank: 1, Size: 2, Ranks: []int{0, 1}, Blocks: 16}, cap: 256, peers: make([]kernels.Ptr, 2)}
	o := &gpuNodeOp{n: &GPUNode{g: g}, name: "allgather"}
	dst := DevSpan{Ptr: 1 << 20, N: 100}
	for _, c := range []struct {
		src         int
		sizes, offs []int
		ok          bool
	}{
		{60, []int{40, 60}, []int{0, 40}, true},
		{0, []int{0, 0}, []int{100, 100}, true},
		{59, []int{40, 60}, []int{0, 40}, false},
		{60, []int{40, 60}, []int{0, 41}, false},
		{60, []int{-1, 60}, []int{0, 40}, false},
		{60, []int{40, 60}, []int{-1, 40}, false},
		{60, []int{41, 60}, []int{60, 0}, false},
	} {
		err := o.Set(dst, DevSpan{Ptr: 1 << 24, N: c.src}, c.sizes, c.offs)
		if c.ok && err != nil {
			t.Errorf("source %d, sizes %v at %v into 100 bytes: %v", c.src, c.sizes, c.offs, err)
		}
		if !c.ok && !errors.Is(err, fault.ErrInvalid) {
			t.Errorf("source %d, sizes %v at %v into 100 bytes: want ErrInvalid, got %v", c.src, c.sizes, c.offs, err)
		}
	}
}

// TestLayoutDisjoint: in a group's segment the identity, every rank's
// control line, its two headers, every reader's acknowledgement line about
// every owner, and every slot (stamp line and data) lie within the segment
// and overlap nothing else.
func TestLayoutDisjoint(t *testing.T) {
	for _, c := range []struct{ L, K, C int }{{1, 2, 64}, {2, 2, 64}, {3, 4, 4096}, {5, 3, 192}, {64, 2, 128}, {65, 2, 64}} {
		l, err := newLayout(c.L, c.K, c.C)
		if err != nil {
			t.Fatal(err)
		}
		mem := make([]byte, l.total)
		base := uintptr(unsafe.Pointer(&mem[0]))
		type part struct {
			what     string
			off, end int
		}
		parts := []part{{"identity", 0, identityBytes}}
		add := func(what string, p unsafe.Pointer, n int) {
			off := int(uintptr(p) - base)
			parts = append(parts, part{what, off, off + n})
		}
		for r := range c.L {
			add(fmt.Sprintf("ctrl %d", r), unsafe.Pointer(l.ctrl(mem, r)), lineBytes)
			for parity := range 2 {
				add(fmt.Sprintf("header %d.%d", r, parity), unsafe.Pointer(l.header(mem, r, parity)), headerBytes)
			}
			for o := range c.L {
				add(fmt.Sprintf("ack %d about %d", r, o), unsafe.Pointer(l.ack(mem, r, o)), lineBytes)
			}
			for k := range c.K {
				stamp, data := l.slot(mem, r, k)
				add(fmt.Sprintf("stamp %d.%d", r, k), unsafe.Pointer(stamp), 8)
				if len(data) != c.C {
					t.Fatalf("%+v: slot %d.%d holds %d bytes", c, r, k, len(data))
				}
				add(fmt.Sprintf("slot %d.%d", r, k), unsafe.Pointer(&data[0]), c.C)
			}
		}
		for i, p := range parts {
			if p.off < 0 || p.end > l.total {
				t.Fatalf("%+v: %s at [%d, %d) outside the %d-byte segment", c, p.what, p.off, p.end, l.total)
			}
			for _, q := range parts[:i] {
				if p.off < q.end && q.off < p.end {
					t.Fatalf("%+v: %s at [%d, %d) overlaps %s at [%d, %d)", c, p.what, p.off, p.end, q.what, q.off, q.end)
				}
			}
		}
	}
}

// TestGPUNodeDeadlineNamesNoPeer: a GPU node that gives up at its caller's
// deadline cannot tell which peer kept it: its ErrTimeout names this rank
// and no peer.
func TestGPUNodeDeadlineNamesNoPeer(t *testing.T) {
	done := make(chan struct{})
	errs := teststore.Run(t, 2, 60*time.Second, func(ctx context.Context, st *rendezvous.Client, r int) error {
		dev, err := device.OpenGPU(0)
		if err != nil {
			return err
		}
		g, err := NewGPU(ctx, GPUConfig{Store: st, Key: "late", Rank: r, Size: 2, Ranks: []int{3, 4}, Dev: dev, Timeout: time.Second})
		if err != nil {
			return err
		}
		defer g.Close(ctx)
		if r == 1 {
			<-done // never takes part
			return nil
		}
		defer close(done)
		ng, err := g.Node()
		if err != nil {
			return err
		}
		defer ng.Close()
		short, stop := context.WithTimeout(ctx, 50*time.Millisecond)
		defer stop()
		err = ng.Barrier(short)
		var oe *fault.OpError
		if !errors.Is(err, fault.ErrTimeout) || !errors.As(err, &oe) || oe.Rank != 3 || oe.Peer != -1 {
			return fmt.Errorf("barrier with a peer that never comes: want ErrTimeout of rank 3 naming no peer, got %v", err)
		}
		return ng.S.Synchronize(ctx)
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// TestExited: exited finds the process that has exited among pidfds, and
// -1 while all live (or there are none).
func TestExited(t *testing.T) {
	if exited(nil) != -1 {
		t.Error("exited(nil) != -1")
	}
	start := func() (*exec.Cmd, io.WriteCloser, int) {
		cmd := exec.Command("cat")
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		fd, err := pidfdOpen(cmd.Process.Pid)
		if err != nil {
			t.Skipf("pidfd_open: %v", err)
		}
		t.Cleanup(func() { in.Close(); cmd.Wait(); closeFD(fd) })
		return cmd, in, fd
	}
	_, _, live := start()
	cmd, in, gone := start()
	fds := []pollFD{{Fd: -1}, {Fd: int32(live), Events: pollIn}, {Fd: int32(gone), Events: pollIn}}
	if i := exited(fds); i != -1 {
		t.Errorf("all live: exited = %d", i)
	}
	in.Close()
	cmd.Wait()
	if i := exited(fds); i != 2 {
		t.Errorf("the third exited: exited = %d", i)
	}
}

// TestOpSetBounds: Plan refuses blocks outside the destination and a
// source overlapping the destination other than at the rank's own block,
// and accepts a block ending at the destination's end and a source right
// before or after the destination.
func TestOpSetBounds(t *testing.T) {
	errs := group(t, 1, Config{Timeout: 20 * time.Second}, func(g *Group) error {
		mem := make([]byte, 300)
		dst := mem[100:200]
		for _, c := range []struct {
			what      string
			src       []byte
			size, off int
			ok        bool
		}{
			{"a block ending at the end", make([]byte, 10), 10, 90, true},
			{"a block one past the end", make([]byte, 10), 10, 91, false},
			{"a negative offset", make([]byte, 10), 10, -1, false},
			{"in place", dst[40:50], 10, 40, true},
			{"a source right before", mem[90:100], 10, 0, true},
			{"a source right after", mem[200:210], 10, 0, true},
			{"a source overlapping the start", mem[95:105], 10, 50, false},
			{"a source overlapping the end", mem[195:205], 10, 0, false},
			{"a source inside, elsewhere", dst[20:30], 10, 40, false},
		} {
			_, err := g.Plan("allgather", dst, c.src, []int{c.size}, []int{c.off})
			if c.ok && err != nil {
				return fmt.Errorf("%s: %v", c.what, err)
			}
			if !c.ok && !errors.Is(err, fault.ErrInvalid) {
				return fmt.Errorf("%s: want ErrInvalid, got %v", c.what, err)
			}
		}
		if _, err := g.Plan("allgather", dst, nil, []int{-1}, []int{0}); !errors.Is(err, fault.ErrInvalid) {
			return fmt.Errorf("a negative size: want ErrInvalid, got %v", err)
		}
		return nil
	})
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
}

// TestOpModes: a block of at least ZeroCopyMin bytes in a symmetric buffer
// is read in place, a smaller one staged; a block of at least CMAMin bytes
// elsewhere is read with process_vm_readv where every rank can, a smaller
// one staged.
func TestOpModes(t *testing.T) {
	const zc, cma = 2048, 4096
	errs := group(t, 2, Config{Timeout: 20 * time.Second, ZeroCopyMin: zc, CMAMin: cma}, func(g *Group) error {
		buf, err := g.Alloc(context.Background(), 2*cma)
		if err != nil {
			return err
		}
		defer buf.Free()
		dst := make([]byte, 4*cma)
		plain := make([]byte, cma)
		cmaMode := uint32(modeStaged)
		if g.cma {
			cmaMode = modeCMA
		}
		for _, c := range []struct {
			what string
			src  []byte
			mode uint32
		}{
			{"ZeroCopyMin bytes in a buffer", buf.Bytes()[:zc], modeSymmetric},
			{"ZeroCopyMin-1 bytes in a buffer", buf.Bytes()[:zc-1], modeStaged},
			{"CMAMin bytes elsewhere", plain, cmaMode},
			{"CMAMin-1 bytes elsewhere", plain[:cma-1], modeStaged},
		} {
			sizes := []int{len(c.src), len(c.src)}
			op, err := g.Plan("allgather", dst, c.src, sizes, []int{0, len(c.src)})
			if err != nil {
				return fmt.Errorf("%s: %v", c.what, err)
			}
			if op.mode != c.mode {
				return fmt.Errorf("%s (cma %v): mode %d, want %d", c.what, g.cma, op.mode, c.mode)
			}
		}
		return g.Barrier(context.Background())
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// TestAllocAndLookupBounds: Alloc of 0 bytes works and a negative size is
// ErrInvalid; lookup finds exactly the slices within this rank's part of a
// buffer (its stride), at their offset.
func TestAllocAndLookupBounds(t *testing.T) {
	errs := group(t, 2, Config{Timeout: 20 * time.Second}, func(g *Group) error {
		if _, err := g.Alloc(context.Background(), -1); !errors.Is(err, fault.ErrInvalid) {
			return fmt.Errorf("Alloc(-1): want ErrInvalid, got %v", err)
		}
		empty, err := g.Alloc(context.Background(), 0)
		if err != nil {
			return fmt.Errorf("Alloc(0): %v", err)
		}
		defer empty.Free()
		b, err := g.Alloc(context.Background(), 100)
		if err != nil {
			return err
		}
		defer b.Free()
		base := g.rank * b.stride
		part := b.seg.Mem[base : base+b.stride]
		cases := []struct {
			what    string
			p       []byte
			off     int
			present bool
		}{
			{"the block", b.Bytes(), 0, true},
			{"the whole stride", part, 0, true},
			{"the stride's last byte", part[b.stride-1:], b.stride - 1, true},
			{"a byte before the part", b.seg.Mem[max(base-1, 0) : base+1], 0, g.rank == 0},
			{"memory elsewhere", make([]byte, 10), 0, false},
			{"nothing", nil, 0, false},
		}
		if g.rank == 0 { // rank 1's part follows
			cases = append(cases, struct {
				what    string
				p       []byte
				off     int
				present bool
			}{"a byte past the stride", b.seg.Mem[base+1 : base+b.stride+1], 0, false})
		}
		for _, c := range cases {
			id, off, ok := g.lookup(c.p)
			if ok != c.present || ok && (id != b.id || off != c.off) {
				return fmt.Errorf("%s: lookup = %d, %d, %v; want %d, %d, %v", c.what, id, off, ok, b.id, c.off, c.present)
			}
		}
		return g.Barrier(context.Background())
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// TestProbeCMA: the probe reads every peer's pid from the address the peer
// published, and fails if any one cannot be read or does not hold the pid.
func TestProbeCMA(t *testing.T) {
	pid := uint32(os.Getpid())
	line := func(self bool, holds uint32) *ctrl {
		c := new(ctrl)
		c.pid = holds
		if self {
			c.self = uint64(uintptr(unsafe.Pointer(&c.pid)))
		}
		return c
	}
	me := line(true, pid)
	readable := []*ctrl{me, line(true, pid), line(true, pid)}
	var got uint32
	local := []unix.Iovec{{Base: (*byte)(unsafe.Pointer(&got)), Len: 4}}
	remote := []unix.RemoteIovec{{Base: uintptr(me.self), Len: 4}}
	if _, err := unix.ProcessVMReadv(int(pid), local, remote, 0); err != nil {
		t.Skipf("process_vm_readv is refused here: %v", err)
	}
	for _, c := range []struct {
		what  string
		ctrls []*ctrl
		want  bool
	}{
		{"every peer readable", readable, true},
		{"a peer at address 0", []*ctrl{me, line(true, pid), line(false, pid)}, false},
		{"a peer holding another pid", []*ctrl{me, line(true, pid), {pid: pid, self: uint64(uintptr(unsafe.Pointer(&readable[1].state)))}}, false},
		{"this rank unreadable, the peers readable", []*ctrl{line(false, pid), line(true, pid)}, true},
	} {
		g := &Group{rank: 0, ctrls: c.ctrls}
		for _, l := range c.ctrls { // as watchPeers takes them at Init
			g.pids = append(g.pids, int(l.pid))
		}
		if got := g.probeCMA(); got != c.want {
			t.Errorf("%s: probeCMA = %v, want %v", c.what, got, c.want)
		}
	}
}

// TestGPURunMismatchedNamesNoPeer: a GPU node that runs with a block no
// peer expects breaks its group with ErrSizeMismatch naming this rank and no
// peer (it does not know which peers differ).
func TestGPURunMismatchedNamesNoPeer(t *testing.T) {
	dev, err := device.OpenGPU(0)
	if err != nil {
		t.Fatal(err)
	}
	errs := teststore.Run(t, 1, 60*time.Second, func(ctx context.Context, st *rendezvous.Client, _ int) error {
		g, err := NewGPU(ctx, GPUConfig{Store: st, Key: "mm", Rank: 0, Size: 1, Ranks: []int{7}, Dev: dev, Cap: 4096, Timeout: 10 * time.Second})
		if err != nil {
			return err
		}
		defer g.Close(ctx)
		ng, err := g.Node()
		if err != nil {
			return err
		}
		defer ng.Close()
		b, err := dev.Alloc(64)
		if err != nil {
			return err
		}
		defer b.Free()
		op, err := ng.Plan("allgather", DevSpan{Ptr: b.Ptr, N: 8}, DevSpan{Ptr: b.Ptr + 32, N: 8}, []int{8}, []int{0})
		if err != nil {
			return err
		}
		err = op.RunMismatched(ctx)
		var oe *fault.OpError
		if !errors.Is(err, fault.ErrSizeMismatch) || !errors.As(err, &oe) || oe.Rank != 7 || oe.Peer != -1 {
			return fmt.Errorf("RunMismatched: want ErrSizeMismatch of rank 7 naming no peer, got %v", err)
		}
		return nil
	})
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
}

// TestCMAReadFault: a cross-memory read that reaches unreadable memory
// part of the way fails, rather than reading other bytes in its place.
func TestCMAReadFault(t *testing.T) {
	page := os.Getpagesize()
	mem, err := unix.Mmap(-1, 0, 2*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	fill(mem[:page], 1)
	if err := unix.Mprotect(mem[page:], unix.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	g := &Group{rank: 1, ctrls: []*ctrl{{pid: uint32(os.Getpid())}, {}}, pids: []int{os.Getpid(), 0}}
	dst := make([]byte, 200)
	addr := uint64(uintptr(unsafe.Pointer(&mem[page-100])))
	if err := g.cmaRead(0, dst[:100], addr); err != nil {
		t.Skipf("process_vm_readv is refused here: %v", err)
	}
	if !bytes.Equal(dst[:100], mem[page-100:page]) {
		t.Fatal("a readable range read wrong")
	}
	if err := g.cmaRead(0, dst, addr); err == nil {
		t.Errorf("a read running 100 bytes into an unreadable page succeeded")
	}
}

// TestSilentRankZeroTimesOut: a rank waiting for a chunk from local rank 0,
// which announced its block but sends nothing, times out naming rank 0 and
// the chunk (rank 0 is the peer index 0, which a wait must not take for
// "no peer").
func TestSilentRankZeroTimesOut(t *testing.T) {
	done := make(chan struct{})
	sizes, offs := []int{100_000, 0}, []int{0, 100_000}
	errs := group(t, 2, ringCfg(300*time.Millisecond), func(g *Group) error {
		op, err := g.Plan("allgather", make([]byte, 100_000), make([]byte, sizes[g.Rank()]), sizes, offs)
		if err != nil {
			return err
		}
		if g.Rank() == 0 {
			announce(op)
			select {
			case <-done:
			case <-time.After(3 * time.Second):
			}
			return nil
		}
		defer close(done)
		err = op.Run(context.Background())
		var oe *fault.OpError
		if !errors.Is(err, fault.ErrTimeout) || !errors.As(err, &oe) || oe.Peer != 0 || !strings.Contains(err.Error(), "for a chunk") {
			return fmt.Errorf("want ErrTimeout naming peer 0 and a chunk, got %v", err)
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// TestLostReaderWhileWaitingForChunk: a rank that waits for a chunk from
// one peer (alive, silent) while another peer, which has not freed a slot
// of its ring, has closed, reports the closed one as lost: a sender
// depends on its readers too.
func TestLostReaderWhileWaitingForChunk(t *testing.T) {
	// earlier: complete calls first: the ring's counters run on across
	// calls, and a reader that has read everything of an earlier call but
	// not of this one is still a dependency.
	for _, earlier := range []int{0, 1} {
		t.Run(fmt.Sprintf("after %d calls", earlier), func(t *testing.T) {
			done := make(chan struct{})
			sizes, offs := []int{200_000, 100_000, 0}, []int{0, 200_000, 300_000}
			errs := group(t, 3, ringCfg(2*time.Second), func(g *Group) error {
				me := g.Rank()
				op, err := g.Plan("allgather", make([]byte, 300_000), make([]byte, sizes[me]), sizes, offs)
				if err != nil {
					return err
				}
				for range earlier {
					if err := op.Run(context.Background()); err != nil {
						return fmt.Errorf("earlier call: %v", err)
					}
				}
				switch me {
				case 1:
					announce(op)
					select {
					case <-done:
					case <-time.After(5 * time.Second):
					}
					return nil
				case 2:
					announce(op)
					return g.Close()
				}
				defer close(done)
				err = op.Run(context.Background())
				var oe *fault.OpError
				if !errors.Is(err, fault.ErrPeerLost) || !errors.As(err, &oe) || oe.Peer != 2 {
					return fmt.Errorf("want ErrPeerLost naming peer 2, got %v", err)
				}
				return nil
			})
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
		})
	}
}

// TestReaderLeftAfterLastChunkSent: once a rank has sent every chunk of its
// block, a reader that leaves without reading them is no loss to it: the
// rank still completes the call with the chunks of a slow, live peer.
func TestReaderLeftAfterLastChunkSent(t *testing.T) {
	done := make(chan struct{})
	sizes, offs := []int{16 << 10, 16 << 10, 0}, []int{0, 16 << 10, 32 << 10}
	errs := group(t, 3, ringCfg(10*time.Second), func(g *Group) error {
		me := g.Rank()
		src := make([]byte, sizes[me])
		fill(src, uint64(me+1))
		dst := make([]byte, 32<<10)
		op, err := g.Plan("allgather", dst, src, sizes, offs)
		if err != nil {
			return err
		}
		switch me {
		case 1: // announces, lets rank 0 sleep and check its peers, then sends its chunks
			announce(op)
			time.Sleep(500 * time.Millisecond)
			c := op.chunk[me]
			for k := range op.count[me] {
				n := g.sent
				slot := int(n % uint64(g.lay.K))
				copy(g.slots[me][slot], src[k*c:min((k+1)*c, len(src))])
				atomic.StoreUint64(g.stamps[me][slot], n+1)
				g.ringAll()
				g.sent++
			}
			<-done
			return nil
		case 2:
			announce(op)
			return g.Close()
		}
		defer close(done)
		if err := op.Run(context.Background()); err != nil {
			return err
		}
		want := make([]byte, sizes[1])
		fill(want, 2)
		if !bytes.Equal(dst[offs[1]:offs[1]+sizes[1]], want) {
			return errors.New("block of rank 1 wrong")
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// TestAbandonTellsPeers: a rank that abandons the group (an error of its
// own) is ErrPeerLost to a peer waiting for it, and is itself broken with
// ErrClosed naming no peer.
func TestAbandonTellsPeers(t *testing.T) {
	done := make(chan struct{})
	errs := group(t, 2, Config{Timeout: 3 * time.Second}, func(g *Group) error {
		if g.Rank() == 1 {
			g.Abandon(errors.New("network down"))
			err := g.Barrier(context.Background())
			var oe *fault.OpError
			if !errors.Is(err, fault.ErrClosed) || !errors.As(err, &oe) || oe.Peer != -1 {
				return fmt.Errorf("after Abandon: want ErrClosed naming no peer, got %v", err)
			}
			<-done
			return nil
		}
		defer close(done)
		err := g.Barrier(context.Background())
		var oe *fault.OpError
		if !errors.Is(err, fault.ErrPeerLost) || !errors.As(err, &oe) || oe.Peer != 1 {
			return fmt.Errorf("want ErrPeerLost naming peer 1, got %v", err)
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// TestZeroCopyFullStride: a symmetric block that fills its buffer's whole
// stride (a multiple of the page size) is read in place by every peer.
func TestZeroCopyFullStride(t *testing.T) {
	n := os.Getpagesize()
	errs := group(t, 2, Config{Timeout: 10 * time.Second}, func(g *Group) error {
		b, err := g.Alloc(context.Background(), n)
		if err != nil {
			return err
		}
		defer b.Free()
		fill(b.Bytes(), uint64(g.Rank()+1))
		dst := make([]byte, 2*n)
		op, err := g.Plan("allgather", dst, b.Bytes(), []int{n, n}, []int{0, n})
		if err != nil {
			return err
		}
		if op.mode != modeSymmetric {
			return fmt.Errorf("mode %d, want zero copy", op.mode)
		}
		if err := op.Run(context.Background()); err != nil {
			return err
		}
		for p := range 2 {
			want := make([]byte, n)
			fill(want, uint64(p+1))
			if !bytes.Equal(dst[p*n:(p+1)*n], want) {
				return fmt.Errorf("block of rank %d wrong", p)
			}
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// TestPeerBufferUnknownOrOverrun: a peer whose header names a symmetric
// buffer this rank never allocated, or a block running past this rank's
// view of that buffer, is refused with ErrSizeMismatch naming that peer,
// not indexed (the ranks' Alloc calls differ). Rank 1 reads its block in
// place from a buffer of two pages; rank 0, whose source is plain memory,
// hides the buffer from its group or sees it one page wide.
func TestPeerBufferUnknownOrOverrun(t *testing.T) {
	const n = 2 * pageBytes
	cases := []struct {
		what, want string
		skew       func(g *Group, b *Buffer) (restore func())
	}{
		{"a buffer never allocated", "has not allocated", func(g *Group, b *Buffer) func() {
			saved := g.bufs
			g.bufs = g.bufs[:b.id]
			return func() { g.bufs = saved }
		}},
		{"a block past the buffer's end", "overruns symmetric buffer", func(g *Group, b *Buffer) func() {
			b.stride = pageBytes
			return func() { b.stride = n }
		}},
	}
	for _, c := range cases {
		t.Run(c.what, func(t *testing.T) {
			errs := group(t, 2, Config{Timeout: 5 * time.Second}, func(g *Group) error {
				b, err := g.Alloc(context.Background(), n)
				if err != nil {
					return err
				}
				defer b.Free()
				src := b.Bytes()
				if g.Rank() == 0 {
					src = make([]byte, n)
				}
				fill(src, uint64(g.Rank()+1))
				op, err := g.Plan("allgather", make([]byte, 2*n), src, []int{n, n}, []int{0, n})
				if err != nil {
					return err
				}
				if g.Rank() == 1 {
					if op.mode != modeSymmetric {
						return fmt.Errorf("mode %d, want zero copy", op.mode)
					}
					var oe *fault.OpError
					if err := op.Run(context.Background()); !errors.As(err, &oe) || oe.Peer != 0 {
						return fmt.Errorf("want an error naming peer 0 (which refused this rank's block), got %v", err)
					}
					return nil
				}
				restore := c.skew(g, b)
				err = op.Run(context.Background())
				restore()
				var oe *fault.OpError
				if !errors.Is(err, fault.ErrSizeMismatch) || !errors.As(err, &oe) || oe.Peer != 1 || !strings.Contains(err.Error(), c.want) {
					return fmt.Errorf("want ErrSizeMismatch naming peer 1 (%q), got %v", c.want, err)
				}
				return nil
			})
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
		})
	}
}

// TestAllocRefusals: a negative size, and a size whose parts on every rank
// (plus the identity page and a page of slack) would not fit in an int, are
// refused at once with ErrInvalid naming no peer; every rank refuses alike
// and no later Alloc is skewed by them.
func TestAllocRefusals(t *testing.T) {
	errs := group(t, 2, Config{Timeout: 5 * time.Second}, func(g *Group) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		limit := (math.MaxInt - 2*pageBytes) / g.size
		for _, c := range []struct {
			n    int
			want string
		}{{-1, "negative size"}, {limit + 1, "do not fit in memory"}, {math.MaxInt, "do not fit in memory"}} {
			b, err := g.Alloc(ctx, c.n)
			var oe *fault.OpError
			if !errors.Is(err, fault.ErrInvalid) || !errors.As(err, &oe) || oe.Peer != -1 || !strings.Contains(err.Error(), c.want) {
				if b != nil {
					b.Free()
				}
				return fmt.Errorf("Alloc(%d): want ErrInvalid naming no peer (%q), got %v", c.n, c.want, err)
			}
		}
		b, err := g.Alloc(ctx, 100)
		if err != nil {
			return err
		}
		defer b.Free()
		// Its id is its call's number, the same on every rank: the
		// three refusals were calls 0 to 2.
		if b.id != 3 || len(b.Bytes()) != 100 {
			return fmt.Errorf("the Alloc after the refusals: id %d, %d bytes; want id 3, 100 bytes", b.id, len(b.Bytes()))
		}
		return g.Barrier(ctx)
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// TestBufferIdentity: a symmetric buffer's segment starts with an identity
// that says what it is: a buffer of the group's size, the Alloc call's
// number (every rank counts the calls alike) and the stride in pages.
func TestBufferIdentity(t *testing.T) {
	errs := group(t, 2, Config{Timeout: 10 * time.Second}, func(g *Group) error {
		for i, n := range []int{100, 3*pageBytes + 1} {
			b, err := g.Alloc(context.Background(), n)
			if err != nil {
				return err
			}
			defer b.Free()
			// The identity page precedes Mem in the same mapping (Skip).
			page := unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(b.seg.Mem)), -pageBytes)), identityBytes)
			got, err := readIdentity(page)
			if err != nil {
				return fmt.Errorf("Alloc(%d): %v", n, err)
			}
			stride := roundUp(n, pageBytes)
			want := identity{kind: kindBuffer, a: 2, b: uint32(i), c: uint32(stride / pageBytes), job: g.job, total: uint64(pageBytes + 2*stride)}
			if got != want {
				return fmt.Errorf("Alloc(%d), call %d: identity %+v, want %+v", n, i, got, want)
			}
		}
		return g.Barrier(context.Background())
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// TestBufferFree: Free unmaps the buffer on this rank and forgets it (its
// bytes are gone, no source is found in it any more); a second Free, and a
// Free after the group closed, do nothing.
func TestBufferFree(t *testing.T) {
	errs := group(t, 2, Config{Timeout: 10 * time.Second}, func(g *Group) error {
		b, err := g.Alloc(context.Background(), 100)
		if err != nil {
			return err
		}
		kept, err := g.Alloc(context.Background(), 100)
		if err != nil {
			return err
		}
		p := b.Bytes()
		if err := b.Free(); err != nil {
			return fmt.Errorf("Free: %v", err)
		}
		if _, _, ok := g.lookup(p); ok || b.Bytes() != nil || g.bufs[b.id] != nil || b.seg.Mem != nil {
			return fmt.Errorf("after Free: found by lookup %v, %d bytes, still in the group %v, mapped %v", ok, len(b.Bytes()), g.bufs[b.id] != nil, b.seg.Mem != nil)
		}
		if err := b.Free(); err != nil {
			return fmt.Errorf("a second Free: %v", err)
		}
		if _, _, ok := g.lookup(kept.Bytes()); !ok {
			return fmt.Errorf("the other buffer is no longer found")
		}
		if err := g.Barrier(context.Background()); err != nil {
			return err
		}
		g.Close()
		if err := kept.Free(); err != nil {
			return fmt.Errorf("Free after Close: %v", err)
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// TestBufferFile: File names the file and the offset at which this
// rank's part lies: what the rank writes into Bytes is in the file there,
// and the other rank reads it there too; once freed, fd is -1.
func TestBufferFile(t *testing.T) {
	errs := group(t, 2, Config{Timeout: 10 * time.Second}, func(g *Group) error {
		b, err := g.Alloc(context.Background(), 3*pageBytes+5)
		if err != nil {
			return err
		}
		for i := range b.Bytes() {
			b.Bytes()[i] = byte(i*7 + g.rank)
		}
		if err := g.Barrier(context.Background()); err != nil {
			return err
		}
		fd, off := b.File()
		if fd < 0 {
			return fmt.Errorf("File: fd %d", fd)
		}
		for r := range 2 {
			// The peer's part: its offset, as that rank's File gives it.
			at := off + int64((r-g.rank)*b.stride)
			got := make([]byte, len(b.Bytes()))
			if n, err := unix.Pread(fd, got, at); err != nil || n != len(got) {
				return fmt.Errorf("pread of rank %d's part: %d, %v", r, n, err)
			}
			for i, v := range got {
				if v != byte(i*7+r) {
					return fmt.Errorf("rank %d's byte %d in the file at %d is %d, want %d", r, i, at, v, byte(i*7+r))
				}
			}
		}
		if err := g.Barrier(context.Background()); err != nil {
			return err
		}
		b.Free()
		if fd, _ := b.File(); fd != -1 {
			return fmt.Errorf("File after Free: fd %d", fd)
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// hiddenDeadline is a context that ends at a deadline it does not report,
// as one whose end a caller arranges some other way: the group's waits
// then learn of the end only from Done and Err.
type hiddenDeadline struct{ context.Context }

func (hiddenDeadline) Deadline() (time.Time, bool) { return time.Time{}, false }

// TestContextEndWhileWaiting: a wait for a silent peer that ends with the
// caller's context, well before Config.Timeout, reports the context's end:
// ErrTimeout naming the peer (late) when the context ended by its
// deadline, context.Canceled naming no peer (this rank gave up; as across
// nodes) when it was cancelled, the peer it waited for said in words.
func TestContextEndWhileWaiting(t *testing.T) {
	cases := []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want error
		peer int
	}{
		{"cancelled", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(200*time.Millisecond, cancel)
			return ctx, cancel
		}, context.Canceled, -1},
		{"deadline", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			return hiddenDeadline{ctx}, cancel
		}, fault.ErrTimeout, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			done := make(chan struct{})
			errs := group(t, 2, Config{Timeout: 20 * time.Second}, func(g *Group) error {
				op, err := g.Plan("allgather", make([]byte, 200), make([]byte, 100), []int{100, 100}, []int{0, 100})
				if err != nil {
					return err
				}
				if g.Rank() == 1 { // silent: never announces
					select {
					case <-done:
					case <-time.After(10 * time.Second):
					}
					return nil
				}
				defer close(done)
				ctx, cancel := c.ctx()
				defer cancel()
				err = op.Run(ctx)
				var oe *fault.OpError
				if !errors.Is(err, c.want) || !errors.As(err, &oe) || oe.Peer != c.peer || !strings.Contains(err.Error(), "context ended while waiting for the header") {
					return fmt.Errorf("want %v naming peer %d, the context's end and the header, got %v", c.want, c.peer, err)
				}
				return nil
			})
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
		})
	}
}

// TestRankZeroLost: rank 0 is a peer like any other: when it closes or
// abandons its group, a rank waiting for it gets ErrPeerLost naming rank 0
// at once, not a timeout.
func TestRankZeroLost(t *testing.T) {
	cases := []struct {
		name, why string
		leave     func(g *Group)
	}{
		{"closed", "peer closed its communicator", func(g *Group) { g.Close() }},
		{"abandoned", "peer abandoned the operation", func(g *Group) { g.Abandon(errors.New("network down")) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			done := make(chan struct{})
			errs := group(t, 2, Config{Timeout: 5 * time.Second}, func(g *Group) error {
				if g.Rank() == 0 {
					c.leave(g)
					<-done
					return nil
				}
				defer close(done)
				err := g.Barrier(context.Background())
				var oe *fault.OpError
				if !errors.Is(err, fault.ErrPeerLost) || !errors.As(err, &oe) || oe.Peer != 0 || !strings.Contains(err.Error(), c.why) {
					return fmt.Errorf("want ErrPeerLost naming peer 0 (%s), got %v", c.why, err)
				}
				return nil
			})
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
		})
	}
}

// TestPeerProcessExited: a peer in another process is watched through its
// pidfd: while that process lives, a wait for the peer goes on; once it
// has exited, the wait ends with ErrPeerLost naming the peer. Rank 0 is
// given the pidfd of a child process for rank 1 (in-process peers have
// none).
func TestPeerProcessExited(t *testing.T) {
	cmd := exec.Command("cat")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer in.Close()
	fd, err := pidfdOpen(cmd.Process.Pid)
	if err != nil {
		t.Skipf("pidfd_open: %v", err)
	}
	done := make(chan struct{})
	errs := group(t, 2, Config{Timeout: 5 * time.Second}, func(g *Group) error {
		if g.Rank() == 1 {
			time.Sleep(300 * time.Millisecond) // rank 0 sleeps and checks rank 1 meanwhile
			if err := g.Barrier(context.Background()); err != nil {
				return err
			}
			<-done // then silent
			return nil
		}
		defer close(done)
		g.pidfds[1], g.pollfds[1] = fd, pollFD{Fd: int32(fd), Events: pollIn} // closed by Close
		if err := g.Barrier(context.Background()); err != nil {
			return fmt.Errorf("with rank 1's process alive: %v", err)
		}
		in.Close()
		cmd.Wait()
		err := g.Barrier(context.Background())
		var oe *fault.OpError
		if !errors.Is(err, fault.ErrPeerLost) || !errors.As(err, &oe) || oe.Peer != 1 || !strings.Contains(err.Error(), "peer process exited") {
			return fmt.Errorf("rank 1's process gone: want ErrPeerLost naming peer 1 (process exited), got %v", err)
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// TestZeroCopyMinOversubscribed: where ranks outnumber cores a default
// ZeroCopyMin is OversubscribedZeroCopyMin; one set by the caller holds.
func TestZeroCopyMinOversubscribed(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    Config
		wantZC int
	}{
		{"default, oversubscribed", Config{HostOversubscribed: true}, OversubscribedZeroCopyMin},
		{"set, oversubscribed", Config{HostOversubscribed: true, ZeroCopyMin: 2048}, 2048},
	} {
		tc.cfg.Timeout, tc.cfg.CMAMin = 20*time.Second, -1
		errs := group(t, 2, tc.cfg, func(g *Group) error {
			if !g.Oversubscribed() {
				return fmt.Errorf("not oversubscribed")
			}
			buf, err := g.Alloc(context.Background(), tc.wantZC)
			if err != nil {
				return err
			}
			defer buf.Free()
			dst := make([]byte, 2*tc.wantZC)
			for _, c := range []struct {
				n    int
				mode uint32
			}{{tc.wantZC, modeSymmetric}, {tc.wantZC - 1, modeStaged}} {
				op, err := g.Plan("allgather", dst, buf.Bytes()[:c.n], []int{c.n, c.n}, []int{0, c.n})
				if err != nil {
					return err
				}
				if op.mode != c.mode {
					return fmt.Errorf("%d bytes in a buffer: mode %d, want %d", c.n, op.mode, c.mode)
				}
			}
			return g.Barrier(context.Background())
		})
		for r, err := range errs {
			if err != nil {
				t.Errorf("%s: rank %d: %v", tc.name, r, err)
			}
		}
	}
}
