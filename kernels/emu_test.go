//go:build cgo && linux

package kernels

import (
	"bytes"
	"cmp"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
)

// These tests load the library through the real loader (SLIME_CUDA_LIB,
// set by TestMain to the emulator): every ABI call, IPC between processes,
// graph capture and replay, illegal calls during capture, events ordering
// streams, the LL all-gather and the barrier among in-process ranks, and
// the upload race that slime_memcpy once had.

func openLib(t testing.TB) *Lib {
	t.Helper()
	lib, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	return lib
}

// emuOnly skips what only the emulator's model can show (its IPC rules,
// its seeds, its legacy-memcpy mode) when the tests run on a GPU.
func emuOnly(t *testing.T, lib *Lib) {
	t.Helper()
	if !lib.Emulated() {
		t.Skipf("%s is not the emulator", lib.Path())
	}
}

func ok(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// syncStream polls s until its work is done (20 s at most).
func syncStream(t testing.TB, lib *Lib, dev int, s Stream) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := lib.StreamQuery(dev, s)
		if err == nil {
			return
		}
		if !errors.Is(err, ErrNotReady) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("stream not done after 20 s")
		}
		time.Sleep(20 * time.Microsecond)
	}
}

func pattern(n, seed int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + seed*31 + 1)
	}
	return b
}

// Every call of the ABI, once at least, on one device.
func TestEmuEveryCall(t *testing.T) {
	lib := openLib(t)
	n, err := lib.DeviceCount()
	ok(t, err)
	name, err := lib.DeviceName(0)
	ok(t, err)
	if lib.Emulated() != strings.Contains(name, "emulated") {
		t.Errorf("device %q, Emulated() = %v", name, lib.Emulated())
	}
	bus, err := lib.PCIBusID(0)
	ok(t, err)
	peer, err := lib.CanAccessPeer(0, 0)
	ok(t, err)
	drv, rt, err := lib.Versions()
	ok(t, err)
	t.Logf("%d device(s): %s %s, peer %v, driver %d runtime %d, emulated %v (seed %d)", n, name, bus, peer, drv, rt, lib.Emulated(), lib.EmuSeed())
	if lib.Emulated() && os.Getenv("SLIME_EMU_SEED") == "13" && lib.EmuSeed() != 13 {
		t.Errorf("SLIME_EMU_SEED=13, the emulator says %d", lib.EmuSeed())
	}
	if _, err := lib.DeviceName(n); !errors.Is(err, ErrCUDA) || !strings.Contains(err.Error(), "invalid device ordinal") {
		t.Errorf("device %d of %d: %v", n, n, err)
	}
	if err := lib.EnablePeerAccess(0, n); err == nil {
		t.Errorf("peer access to device %d of %d: no error", n, n)
	}

	const size = 4099
	a, err := lib.Malloc(0, size)
	ok(t, err)
	b, err := lib.Malloc(0, size)
	ok(t, err)
	in := pattern(size, 1)
	ok(t, lib.CopyFromHost(0, a, in))
	ok(t, lib.Memcpy(0, b, a, size))
	out := make([]byte, size)
	ok(t, lib.CopyToHost(0, out, b))
	if !bytes.Equal(out, in) {
		t.Fatal("Memcpy: wrong bytes")
	}
	ok(t, lib.Memset(0, b, 0x3c, 100))
	ok(t, lib.CopyToHost(0, out, b))
	if out[0] != 0x3c || out[99] != 0x3c || out[100] != in[100] {
		t.Fatal("Memset: wrong bytes")
	}

	host, hd, err := lib.HostAlloc(0, 64)
	ok(t, err)
	s, err := lib.StreamCreate(0)
	ok(t, err)
	e0, err := lib.EventCreate(0, true)
	ok(t, err)
	e1, err := lib.EventCreate(0, true)
	ok(t, err)
	ok(t, lib.EventRecord(0, e0, s))
	ok(t, lib.MemsetAsync(0, b, 0x11, size, s))
	ok(t, lib.MemcpyAsync(0, hd, b, 64, s))
	ok(t, lib.EventRecord(0, e1, s))
	ok(t, lib.StreamWaitEvent(0, s, e1))
	syncStream(t, lib, 0, s)
	ok(t, lib.EventQuery(0, e1))
	if ms, err := lib.EventElapsed(0, e0, e1); err != nil || ms < 0 {
		t.Fatalf("elapsed %v ms: %v", ms, err)
	}
	if got := (*[64]byte)(host); got[0] != 0x11 || got[63] != 0x11 {
		t.Fatalf("mapped host memory: % x", got[:4])
	}

	// a graph of one memset, replayed
	ok(t, lib.GraphBegin(0, s))
	ok(t, lib.MemsetAsync(0, b, 0x22, size, s))
	g, err := lib.GraphEnd(0, s)
	ok(t, err)
	ok(t, lib.GraphLaunch(0, g, s))
	syncStream(t, lib, 0, s)
	ok(t, lib.CopyToHost(0, out, b))
	if out[0] != 0x22 || out[size-1] != 0x22 {
		t.Fatal("graph replay: wrong bytes")
	}
	ok(t, lib.GraphDestroy(0, g))

	// GEMM, both precisions, with padded leading dimensions
	testGemm(t, lib, s)

	// IPC handle (the open is a test of its own, across processes)
	if _, err := lib.IPCHandle(0, a); err != nil {
		t.Fatal(err)
	}

	ok(t, lib.EventDestroy(0, e0))
	ok(t, lib.EventDestroy(0, e1))
	ok(t, lib.StreamDestroy(0, s))
	ok(t, lib.HostFree(0, host))
	ok(t, lib.Free(0, a))
	ok(t, lib.Free(0, b))
	if err := lib.Free(0, a); !errors.Is(err, ErrCUDA) || !strings.Contains(err.Error(), "slime_free") {
		t.Errorf("double free: %v", err)
	}
}

func testGemm(t *testing.T, lib *Lib, s Stream) {
	const m, n, k = 5, 7, 3
	const lda, ldb, ldc = k + 2, n + 1, n + 3
	h, err := lib.BlasCreate(0)
	ok(t, err)
	defer func() { ok(t, lib.BlasDestroy(0, h)) }()
	for _, f64 := range []bool{false, true} {
		es := 4
		if f64 {
			es = 8
		}
		av := make([]float64, m*lda)
		bv := make([]float64, k*ldb)
		for i := range av {
			av[i] = float64(i%11) - 3.5
		}
		for i := range bv {
			bv[i] = float64(i%7)*0.25 + 1
		}
		enc := func(v []float64) []byte {
			out := make([]byte, len(v)*es)
			for i, x := range v {
				if f64 {
					*(*float64)(unsafe.Pointer(&out[i*8])) = x
				} else {
					*(*float32)(unsafe.Pointer(&out[i*4])) = float32(x)
				}
			}
			return out
		}
		up := func(v []byte) Ptr {
			p, err := lib.Malloc(0, uint64(len(v)))
			ok(t, err)
			ok(t, lib.CopyFromHost(0, p, v))
			return p
		}
		a, b := up(enc(av)), up(enc(bv))
		c, err := lib.Malloc(0, uint64(m*ldc*es))
		ok(t, err)
		if f64 {
			ok(t, lib.GemmF64(0, h, s, m, n, k, a, lda, b, ldb, c, ldc))
		} else {
			ok(t, lib.GemmF32(0, h, s, m, n, k, a, lda, b, ldb, c, ldc))
		}
		syncStream(t, lib, 0, s)
		out := make([]byte, m*ldc*es)
		ok(t, lib.CopyToHost(0, out, c))
		for i := 0; i < m; i++ {
			for j := 0; j < n; j++ {
				want := 0.0
				for p := 0; p < k; p++ {
					want += av[i*lda+p] * bv[p*ldb+j]
				}
				var got float64
				if f64 {
					got = *(*float64)(unsafe.Pointer(&out[(i*ldc+j)*8]))
				} else {
					got = float64(*(*float32)(unsafe.Pointer(&out[(i*ldc+j)*4])))
				}
				if math.Abs(got-want) > 1e-4*math.Max(1, math.Abs(want)) {
					t.Fatalf("f64 %v: C[%d][%d] = %v, want %v", f64, i, j, got, want)
				}
			}
		}
		// cuBLAS's argument checks: a leading dimension too small
		if err := lib.GemmF32(0, h, s, m, n, k, a, k-1, b, ldb, c, ldc); err == nil {
			t.Error("lda < k: no error")
		}
		for _, p := range []Ptr{a, b, c} {
			ok(t, lib.Free(0, p))
		}
	}
}

// Events order streams; without them, the emulator runs two streams'
// work in either order.
func TestEmuEventsOrderStreams(t *testing.T) {
	lib := openLib(t)
	const size = 1 << 12
	buf, err := lib.Malloc(0, size)
	ok(t, err)
	out, err := lib.Malloc(0, size)
	ok(t, err)
	defer lib.Free(0, buf)
	defer lib.Free(0, out)
	a, err := lib.StreamCreate(0)
	ok(t, err)
	b, err := lib.StreamCreate(0)
	ok(t, err)
	defer lib.StreamDestroy(0, a)
	defer lib.StreamDestroy(0, b)
	e, err := lib.EventCreate(0, false)
	ok(t, err)
	defer lib.EventDestroy(0, e)
	got := make([]byte, size)
	run := func(i int, ordered bool) bool {
		ok(t, lib.Memset(0, out, 0, size))
		ok(t, lib.MemsetAsync(0, buf, byte(i), size, a))
		if ordered {
			ok(t, lib.EventRecord(0, e, a))
			ok(t, lib.StreamWaitEvent(0, b, e))
		}
		ok(t, lib.MemcpyAsync(0, out, buf, size, b))
		syncStream(t, lib, 0, a)
		syncStream(t, lib, 0, b)
		ok(t, lib.CopyToHost(0, got, out))
		return got[0] == byte(i) && got[size-1] == byte(i)
	}
	for i := 1; i <= 100; i++ {
		if !run(i, true) {
			t.Fatalf("run %d: the copy ran before the memset it waited for", i)
		}
	}
	if !lib.Emulated() {
		return
	}
	for i := 1; i <= 300; i++ {
		if !run(i, false) {
			t.Logf("unordered: the copy overtook the memset at run %d", i)
			return
		}
	}
	t.Fatal("300 unordered runs, always in issue order: the emulator does not reorder streams")
}

// A graph replays what was captured, and nothing else: work issued on the
// stream before the capture, on another stream during it, or with the
// synchronous calls is not part of it; streams forked through events join.
func TestEmuCaptureReplay(t *testing.T) {
	lib := openLib(t)
	const size = 1000
	src, err := lib.Malloc(0, size)
	ok(t, err)
	dst, err := lib.Malloc(0, size)
	ok(t, err)
	side, err := lib.Malloc(0, size)
	ok(t, err)
	s, err := lib.StreamCreate(0)
	ok(t, err)
	other, err := lib.StreamCreate(0)
	ok(t, err)
	fork, err := lib.EventCreate(0, false)
	ok(t, err)
	join, err := lib.EventCreate(0, false)
	ok(t, err)

	ok(t, lib.MemsetAsync(0, side, 0x01, size, s)) // before: not captured
	syncStream(t, lib, 0, s)
	ok(t, lib.GraphBegin(0, s))
	ok(t, lib.EventRecord(0, fork, s))
	ok(t, lib.StreamWaitEvent(0, other, fork)) // other joins the capture
	ok(t, lib.MemcpyAsync(0, dst, src, size/2, s))
	ok(t, lib.MemcpyAsync(0, dst+size/2, src+size/2, size/2, other))
	ok(t, lib.EventRecord(0, join, other))
	ok(t, lib.StreamWaitEvent(0, s, join))
	ok(t, lib.Memset(0, side, 0x02, size)) // synchronous: runs now, not captured
	g, err := lib.GraphEnd(0, s)
	ok(t, err)
	defer lib.GraphDestroy(0, g)

	got := make([]byte, size)
	ok(t, lib.CopyToHost(0, got, dst))
	if bytes.Equal(got, pattern(size, 0)) {
		t.Fatal("the capture ran the copies")
	}
	for i := 0; i < 50; i++ {
		in := pattern(size, i)
		ok(t, lib.CopyFromHost(0, src, in))
		ok(t, lib.Memset(0, side, 0x03, size))
		ok(t, lib.GraphLaunch(0, g, s))
		syncStream(t, lib, 0, s)
		ok(t, lib.CopyToHost(0, got, dst))
		if !bytes.Equal(got, in) {
			t.Fatalf("replay %d: dst is not the new src", i)
		}
		ok(t, lib.CopyToHost(0, got, side))
		if got[0] != 0x03 {
			t.Fatalf("replay %d: the replay touched memory no captured node writes (%#x)", i, got[0])
		}
	}
	// the forked stream left the capture: its work runs at once again
	ok(t, lib.MemsetAsync(0, side, 0x04, size, other))
	syncStream(t, lib, 0, other)
	ok(t, lib.CopyToHost(0, got, side))
	if got[0] != 0x04 {
		t.Fatal("the forked stream still captures after the end")
	}
}

// Calls that CUDA refuses during a capture fail, naming CUDA's error, and
// invalidate the capture; the stream is usable afterwards.
func TestEmuIllegalDuringCapture(t *testing.T) {
	lib := openLib(t)
	emuOnly(t, lib)
	buf, err := lib.Malloc(0, 256)
	ok(t, err)
	defer lib.Free(0, buf)
	outside, err := lib.EventCreate(0, false)
	ok(t, err)
	host := make([]byte, 256)
	cases := []struct {
		name    string
		illegal func(s, other Stream) error
		want    string // in the illegal call's error
		endWant string // in GraphEnd's error
	}{
		{"query the capturing stream", func(s, _ Stream) error { return lib.StreamQuery(0, s) },
			"cudaErrorStreamCaptureUnsupported", "cudaErrorStreamCaptureInvalidated"},
		{"wait on an event from outside", func(s, other Stream) error {
			ok(t, lib.EventRecord(0, outside, other))
			return lib.StreamWaitEvent(0, s, outside)
		}, "cudaErrorStreamCaptureIsolation", "cudaErrorStreamCaptureInvalidated"},
		{"copy from pageable memory", func(s, _ Stream) error {
			return lib.MemcpyAsync(0, buf, Ptr(uintptr(unsafe.Pointer(&host[0]))), 256, s)
		}, "cudaErrorStreamCaptureUnsupported", "cudaErrorStreamCaptureInvalidated"},
		{"begin twice", func(s, _ Stream) error { return lib.GraphBegin(0, s) },
			"cudaErrorIllegalState", "cudaErrorStreamCaptureInvalidated"},
		{"destroy the capturing stream", func(s, _ Stream) error { return lib.StreamDestroy(0, s) },
			"cudaErrorStreamCaptureUnsupported", "cudaErrorStreamCaptureInvalidated"},
		{"fork without a join", func(s, other Stream) error {
			e, err := lib.EventCreate(0, false)
			ok(t, err)
			ok(t, lib.EventRecord(0, e, s))
			ok(t, lib.StreamWaitEvent(0, other, e))
			return lib.MemsetAsync(0, buf, 1, 256, other)
		}, "", "cudaErrorStreamCaptureUnjoined"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := lib.StreamCreate(0)
			ok(t, err)
			other, err := lib.StreamCreate(0)
			ok(t, err)
			ok(t, lib.GraphBegin(0, s))
			ok(t, lib.MemsetAsync(0, buf, 7, 256, s))
			err = c.illegal(s, other)
			if c.want == "" && err != nil {
				t.Fatalf("legal call: %v", err)
			}
			if c.want != "" && (!errors.Is(err, ErrCUDA) || !strings.Contains(err.Error(), c.want)) {
				t.Fatalf("illegal call: %v, want %s", err, c.want)
			}
			g, err := lib.GraphEnd(0, s)
			if err == nil || g != 0 || !strings.Contains(err.Error(), c.endWant) {
				t.Fatalf("GraphEnd after it: graph %d, %v; want %s", g, err, c.endWant)
			}
			// the stream works again, eagerly
			ok(t, lib.MemsetAsync(0, buf, 9, 256, s))
			syncStream(t, lib, 0, s)
			syncStream(t, lib, 0, other)
			ok(t, lib.StreamDestroy(0, s))
			ok(t, lib.StreamDestroy(0, other))
		})
	}
}

// The upload race: slime_memcpy from pageable memory used to be
// cudaMemcpy on the legacy stream, which returns once the source is staged
// and orders only the legacy stream, so a copy on a non-blocking stream
// right after could read the old bytes. A child process runs the old calls
// (SLIME_EMU_MEMCPY=legacy) with a fixed seed and must see stale data;
// this process runs the library's own and must never.
func TestUploadRace(t *testing.T) {
	lib := openLib(t)
	if n := uploadTrials(lib, 300); n >= 0 {
		t.Fatalf("trial %d read stale data after slime_memcpy returned", n)
	}
	if !lib.Emulated() {
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "SLIME_KERNELS_CHILD=upload", "SLIME_EMU_MEMCPY=legacy", "SLIME_EMU_SEED=13")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("the legacy calls never raced (seed 13): %v\n%s", err, out)
	}
	t.Logf("legacy cudaMemcpy, seed 13: %s", strings.TrimSpace(string(out)))
}

// uploadTrials uploads, then copies on a non-blocking stream, and returns
// the first trial that read stale bytes (-1: none).
func uploadTrials(lib *Lib, trials int) int {
	const size = 1 << 14
	dst, _ := lib.Malloc(0, size)
	out, _ := lib.Malloc(0, size)
	s, _ := lib.StreamCreate(0)
	defer lib.Free(0, dst)
	defer lib.Free(0, out)
	defer lib.StreamDestroy(0, s)
	got := make([]byte, size)
	for i := 0; i < trials; i++ {
		in := bytes.Repeat([]byte{byte(i + 1)}, size)
		if err := lib.CopyFromHost(0, dst, in); err != nil {
			panic(err)
		}
		if err := lib.MemcpyAsync(0, out, dst, size, s); err != nil {
			panic(err)
		}
		for lib.StreamQuery(0, s) != nil {
			time.Sleep(10 * time.Microsecond)
		}
		if err := lib.CopyToHost(0, got, out); err != nil {
			panic(err)
		}
		if !bytes.Equal(got, in) {
			return i
		}
	}
	return -1
}

// IPC between two processes: the child maps the parent's allocation, reads
// it and writes it; opening a handle in its own process fails, as CUDA's.
func TestEmuIPC(t *testing.T) {
	lib := openLib(t)
	const size = 3 << 20
	p, err := lib.Malloc(0, size)
	ok(t, err)
	defer lib.Free(0, p)
	ok(t, lib.CopyFromHost(0, p, pattern(size, 5)))
	h, err := lib.IPCHandle(0, p)
	ok(t, err)
	// MemRange finds the allocation from any address in it (an exporter
	// sends a view's offset in its allocation), and refuses one in none.
	if b, n, err := lib.MemRange(0, p+size-1); err != nil || b != p || n < size {
		t.Errorf("MemRange of the allocation's last byte: %#x, %d, %v; want %#x, >= %d", b, n, err, p, size)
	}
	if _, _, err := lib.MemRange(0, 8); !errors.Is(err, ErrCUDA) {
		t.Errorf("MemRange of an address in no allocation: %v", err)
	}
	if lib.Emulated() {
		if _, err := lib.IPCOpen(0, h); !errors.Is(err, ErrCUDA) || !strings.Contains(err.Error(), "slime_ipc_open") {
			t.Errorf("opening its own handle: %v", err)
		}
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "SLIME_KERNELS_CHILD=ipc", "SLIME_KERNELS_HANDLE="+hex.EncodeToString(h[:]),
		fmt.Sprintf("SLIME_KERNELS_SIZE=%d", size))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	got := make([]byte, size)
	ok(t, lib.CopyToHost(0, got, p))
	if !bytes.Equal(got, pattern(size, 6)) {
		t.Fatal("the child's writes are not in the parent's memory")
	}
}

// Peer access: with two emulated devices, a kernel on device 0 that touches
// device 1's memory fails until peer access is enabled (twice: no error).
func TestEmuPeerAccess(t *testing.T) {
	lib := openLib(t)
	emuOnly(t, lib)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "SLIME_KERNELS_CHILD=peer", "SLIME_EMU_DEVICES=2")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

// runChild is the child process's part of a test; its exit code is the
// verdict.
func runChild(which string) int {
	lib, err := Open()
	if err != nil {
		fmt.Println(err, "[untrusted:", errors.Is(err, ErrUntrusted), "]")
		return 1
	}
	switch which {
	case "upload":
		if n := uploadTrials(lib, 300); n >= 0 {
			fmt.Printf("stale data at trial %d of 300\n", n)
			return 3
		}
		fmt.Println("no stale data in 300 trials")
		return 0
	case "ipc":
		var h [IPCHandleBytes]byte
		raw, _ := hex.DecodeString(os.Getenv("SLIME_KERNELS_HANDLE"))
		copy(h[:], raw)
		var size int
		fmt.Sscan(os.Getenv("SLIME_KERNELS_SIZE"), &size)
		p, err := lib.IPCOpen(0, h)
		if err != nil {
			fmt.Println(err)
			return 1
		}
		// As CUDA: a handle opened again in the same context returns the
		// same pointer and counts the open; each open takes a close.
		if q, err := lib.IPCOpen(0, h); err != nil || q != p {
			fmt.Printf("child: a handle opened again: %#x, %v; want %#x (CUDA counts the open and returns the same pointer)\n", q, err, p)
			return 1
		}
		if b, n, err := lib.MemRange(0, p+1000); err != nil || b != p || n < uint64(size) {
			fmt.Printf("child: MemRange in the mapped allocation: %#x, %d, %v; want %#x, >= %d\n", b, n, err, p, size)
			return 1
		}
		got := make([]byte, size)
		if err := lib.CopyToHost(0, got, p); err != nil || !bytes.Equal(got, pattern(size, 5)) {
			fmt.Println("child: wrong bytes in the mapped allocation", err)
			return 1
		}
		// The first of two closes leaves the mapping in place.
		if err := lib.IPCClose(0, p); err != nil {
			fmt.Println("child: first close:", err)
			return 1
		}
		clear(got)
		if err := lib.CopyToHost(0, got, p); err != nil || !bytes.Equal(got, pattern(size, 5)) {
			fmt.Println("child: wrong bytes in the mapping after one of two closes", err)
			return 1
		}
		if err := lib.CopyFromHost(0, p, pattern(size, 6)); err != nil {
			fmt.Println(err)
			return 1
		}
		if err := lib.IPCClose(0, p); err != nil {
			fmt.Println("child: second close:", err)
			return 1
		}
		// A close more than the opens is an error (the emulator's; what
		// CUDA returns for a pointer no longer mapped is not tested).
		if lib.Emulated() {
			if err := lib.IPCClose(0, p); !errors.Is(err, ErrCUDA) {
				fmt.Println("child: a third close of a handle opened twice:", err)
				return 1
			}
		}
		return 0
	case "peer":
		if n, _ := lib.DeviceCount(); n != 2 {
			fmt.Println("devices:", n)
			return 1
		}
		far, err := lib.Malloc(1, 64)
		if err != nil {
			fmt.Println(err)
			return 1
		}
		st, sd, _ := lib.HostAlloc(0, 64)
		_ = st
		ep, _ := lib.Malloc(0, 64)
		lib.Memset(0, ep, 0, 64)
		s, _ := lib.StreamCreate(0)
		a := &BarrierArgs{Rank: 0, NRanks: 1, Epoch: ep, Status: sd, TimeoutNS: 1e9}
		a.Flags[0] = far
		if err := lib.Barrier(0, a, s); err == nil || !strings.Contains(err.Error(), "peer access") {
			fmt.Println("kernel touching another device's memory without peer access:", err)
			return 1
		}
		for i := 0; i < 2; i++ {
			if err := lib.EnablePeerAccess(0, 1); err != nil {
				fmt.Println(err)
				return 1
			}
		}
		if err := lib.Barrier(0, a, s); err != nil {
			fmt.Println(err)
			return 1
		}
		return 0
	}
	if which == "open" { // TestPlantedLibraryNotLoaded
		fmt.Println("opened", lib.Path())
		return 0
	}
	fmt.Println("unknown child", which)
	return 1
}

// ---- the LL all-gather and the barrier among in-process ranks -------------

type agRank struct {
	region, counters Ptr
	status           unsafe.Pointer
	statusD          Ptr
	stream           Stream
	src, dst         Ptr
}

type agGroup struct {
	lib    *Lib
	p      int
	cap    uint64
	sizes  []int
	offs   []int
	total  int
	ranks  []agRank
	blocks int
}

func align(n uint64) uint64 { return (n + 255) &^ 255 }

func (g *agGroup) flagsOff() uint64   { return align(2 * uint64(g.p) * g.cap) }
func (g *agGroup) barrierOff() uint64 { return g.flagsOff() + align(FlagBytes(g.p)) }

func newGroup(t *testing.T, lib *Lib, sizes []int, cap uint64, blocks int) *agGroup {
	g := &agGroup{lib: lib, p: len(sizes), cap: cap, sizes: sizes, blocks: blocks}
	for _, s := range sizes {
		g.offs = append(g.offs, g.total)
		g.total += s
	}
	g.ranks = make([]agRank, g.p)
	for r := range g.ranks {
		x := &g.ranks[r]
		var err error
		n := g.barrierOff() + align(8*uint64(g.p))
		x.region, err = lib.Malloc(0, n)
		ok(t, err)
		ok(t, lib.Memset(0, x.region, 0, n))
		x.counters, err = lib.Malloc(0, CounterBytes)
		ok(t, err)
		ok(t, lib.Memset(0, x.counters, 0, CounterBytes))
		x.status, x.statusD, err = lib.HostAlloc(0, 64)
		ok(t, err)
		x.stream, err = lib.StreamCreate(0)
		ok(t, err)
		x.src, err = lib.Malloc(0, uint64(max(sizes[r], 1)))
		ok(t, err)
		x.dst, err = lib.Malloc(0, uint64(max(g.total, 1)))
		ok(t, err)
	}
	t.Cleanup(func() {
		for _, x := range g.ranks {
			lib.StreamDestroy(0, x.stream)
			for _, p := range []Ptr{x.region, x.counters, x.src, x.dst} {
				lib.Free(0, p)
			}
			lib.HostFree(0, x.status)
		}
	})
	return g
}

// rounds are rank r's launches, as intra.GPUGroup.Plan makes them.
func (g *agGroup) rounds(r int, timeout time.Duration) []AllGatherArgs {
	most := 0
	for _, s := range g.sizes {
		most = max(most, s)
	}
	nr := max(1, (most+int(g.cap)-1)/int(g.cap))
	clamp := func(size, j int) uint64 { return uint64(min(max(size-j*int(g.cap), 0), int(g.cap))) }
	out := make([]AllGatherArgs, nr)
	for j := range out {
		a := &out[j]
		a.Rank, a.NRanks = int32(r), int32(g.p)
		a.Cap = g.cap
		a.Bytes = clamp(g.sizes[r], j)
		a.Src = g.ranks[r].src + Ptr(uint64(j)*g.cap)
		a.Total = uint64(g.sizes[r])
		a.Dst = g.ranks[r].dst
		for s := 0; s < g.p; s++ {
			a.Off[s] = uint64(g.offs[s]) + uint64(j)*g.cap
			a.Expect[s] = clamp(g.sizes[s], j)
			a.Totals[s] = uint64(g.sizes[s])
			a.Scratch[s] = g.ranks[s].region
			a.Flags[s] = g.ranks[s].region + Ptr(g.flagsOff())
		}
		a.Epoch, a.Sync = g.ranks[r].counters, g.ranks[r].counters+8
		a.Status = g.ranks[r].statusD
		a.TimeoutNS = uint64(timeout)
	}
	return out
}

func (g *agGroup) upload(t *testing.T, iter int) []byte {
	want := make([]byte, 0, g.total)
	for r := range g.ranks {
		blk := pattern(g.sizes[r], r*1000+iter)
		ok(t, g.lib.CopyFromHost(0, g.ranks[r].src, blk))
		want = append(want, blk...)
	}
	return want
}

func (g *agGroup) check(t *testing.T, what string, want []byte) [][]byte {
	var outs [][]byte
	for r := range g.ranks {
		syncStream(t, g.lib, 0, g.ranks[r].stream)
	}
	for r := range g.ranks {
		if w := atomic.LoadInt32((*int32)(g.ranks[r].status)); w != 0 {
			t.Fatalf("%s: rank %d status %#x", what, r, w)
		}
		got := make([]byte, g.total)
		ok(t, g.lib.CopyToHost(0, got, g.ranks[r].dst))
		if !bytes.Equal(got, want) {
			bad := 0
			for i := range got {
				if got[i] != want[i] {
					bad++
				}
			}
			t.Fatalf("%s: rank %d: %d wrong bytes of %d", what, r, bad, g.total)
		}
		outs = append(outs, got)
	}
	return outs
}

// The LL all-gather among P = 1..8 ranks (threads of this process), odd
// and uneven sizes (a zero among them), several rounds, several blocks:
// eager calls, then one captured graph per rank replayed with new data,
// both bit-identical to the blocks.
func TestEmuAllGather(t *testing.T) {
	lib := openLib(t)
	for p := 1; p <= 8; p++ {
		t.Run(fmt.Sprint("P=", p), func(t *testing.T) {
			sizes := make([]int, p)
			for r := range sizes {
				sizes[r] = 1 + (r*389+p*131)%1201
			}
			if p > 2 {
				sizes[1] = 0
			}
			g := newGroup(t, lib, sizes, 512, 1+p%3)
			plans := make([][]AllGatherArgs, p)
			for r := range plans {
				plans[r] = g.rounds(r, 10*time.Second)
			}
			launch := func(r int) {
				for j := range plans[r] {
					ok(t, lib.AllGatherLL(0, &plans[r][j], g.blocks, g.ranks[r].stream))
				}
			}
			var eager [][]byte
			for it := 0; it < 4; it++ {
				want := g.upload(t, it)
				for r := range g.ranks {
					launch(r)
				}
				eager = g.check(t, fmt.Sprint("eager call ", it), want)
			}
			graphs := make([]Graph, p)
			for r := range g.ranks {
				ok(t, lib.GraphBegin(0, g.ranks[r].stream))
				launch(r)
				var err error
				graphs[r], err = lib.GraphEnd(0, g.ranks[r].stream)
				ok(t, err)
				defer lib.GraphDestroy(0, graphs[r])
			}
			for it := 0; it < 6; it++ {
				want := g.upload(t, it)
				for r := range g.ranks {
					ok(t, lib.GraphLaunch(0, graphs[r], g.ranks[r].stream))
				}
				got := g.check(t, fmt.Sprint("replay ", it), want)
				if it == 3 {
					for r := range got {
						if !bytes.Equal(got[r], eager[r]) {
							t.Fatalf("rank %d: graph and eager differ", r)
						}
					}
				}
			}
		})
	}
}

// A rank that never launches: the others' kernels give up after their
// timeout and name it in the status word; a block of another size than
// announced is a size error naming its source.
func TestEmuAllGatherFailures(t *testing.T) {
	lib := openLib(t)
	g := newGroup(t, lib, []int{100, 100, 100}, 256, 2)
	for r := 0; r < 2; r++ {
		a := g.rounds(r, 50*time.Millisecond)
		ok(t, lib.AllGatherLL(0, &a[0], g.blocks, g.ranks[r].stream))
	}
	for r := 0; r < 2; r++ {
		syncStream(t, lib, 0, g.ranks[r].stream)
		if w := atomic.LoadInt32((*int32)(g.ranks[r].status)); w != StatusTimeout|2<<8 {
			t.Errorf("rank %d status %#x, want a timeout naming rank 2", r, w)
		}
	}

	m := newGroup(t, lib, []int{64, 64}, 256, 1)
	a0, a1 := m.rounds(0, 5*time.Second), m.rounds(1, 5*time.Second)
	a0[0].Totals[1] = 65 // rank 0 expects another size from rank 1
	ok(t, lib.AllGatherLL(0, &a0[0], 1, m.ranks[0].stream))
	ok(t, lib.AllGatherLL(0, &a1[0], 1, m.ranks[1].stream))
	syncStream(t, lib, 0, m.ranks[0].stream)
	syncStream(t, lib, 0, m.ranks[1].stream)
	if w := atomic.LoadInt32((*int32)(m.ranks[0].status)); w != StatusSize|1<<8 {
		t.Errorf("rank 0 status %#x, want a size error naming rank 1", w)
	}

	// arguments the library refuses
	bad := a1[0]
	bad.Rank = 5
	if err := lib.AllGatherLL(0, &bad, 1, m.ranks[1].stream); !errors.Is(err, ErrInvalid) {
		t.Errorf("rank 5 of 2: %v", err)
	}
	// A pointer in no allocation: the emulator refuses the launch; a GPU
	// would fault, an illegal address that poisons the context for the
	// rest of the test binary, so it is launched on the emulator only.
	if lib.Emulated() {
		bad = a1[0]
		bad.Scratch[0] = 0x1000
		if err := lib.AllGatherLL(0, &bad, 1, m.ranks[1].stream); err == nil {
			t.Error("a scratch pointer in no allocation: no error")
		}
	}
}

// TestEmuAllGatherPeerRunsAhead: a rank whose status word is set (an
// earlier round or call of it failed, as after a size mismatch) stops
// waiting for its peers' flags, so its later launches run on without them
// and may lap a peer still at an earlier epoch: rank 0 runs epochs 1, 2
// and 3 before rank 1 starts epoch 1, and its flag in rank 1's slot 1 then
// says 3 where rank 1 waits for 1. Rank 1 must stop at once with the size
// status naming rank 0 (the lapping rank's flags announce a poisoned
// total), not spin until its timeout: in a GPU job across nodes that
// timeout was the liar's error, where every rank must see the mismatch.
func TestEmuAllGatherPeerRunsAhead(t *testing.T) {
	lib := openLib(t)
	for _, rounds := range []int{1, 3} {
		t.Run(fmt.Sprint("rounds=", rounds), func(t *testing.T) {
			const timeout = 5 * time.Second
			m := newGroup(t, lib, []int{64 * rounds, 64 * rounds}, 64, 1)
			a0, a1 := m.rounds(0, timeout), m.rounds(1, timeout)
			atomic.StoreInt32((*int32)(m.ranks[0].status), StatusSize|1<<8)
			// Rank 0: three calls' launches; a call of several rounds
			// laps within itself.
			for range 3 {
				for j := range a0 {
					ok(t, lib.AllGatherLL(0, &a0[j], 1, m.ranks[0].stream))
				}
				if rounds > 1 {
					break
				}
			}
			syncStream(t, lib, 0, m.ranks[0].stream)
			start := time.Now()
			ok(t, lib.AllGatherLL(0, &a1[0], 1, m.ranks[1].stream))
			syncStream(t, lib, 0, m.ranks[1].stream)
			if w := atomic.LoadInt32((*int32)(m.ranks[1].status)); w != StatusSize|0<<8 {
				t.Errorf("rank 1 status %#x after %v, want the size status naming rank 0 (%#x)", w, time.Since(start).Round(time.Millisecond), StatusSize)
			}
			if el := time.Since(start); el > timeout/2 {
				t.Errorf("rank 1 took %v to learn that rank 0 gave up (timeout %v)", el, timeout)
			}
		})
	}
}

// The barrier among P ranks, many times, and with one missing.
func TestEmuBarrier(t *testing.T) {
	lib := openLib(t)
	for _, p := range []int{1, 2, 5, 8} {
		g := newGroup(t, lib, make([]int, p), 256, 1)
		args := make([]BarrierArgs, p)
		for r := range args {
			a := &args[r]
			a.Rank, a.NRanks = int32(r), int32(p)
			for s := 0; s < p; s++ {
				a.Flags[s] = g.ranks[s].region + Ptr(g.barrierOff())
			}
			a.Epoch = g.ranks[r].counters + 24
			a.Status = g.ranks[r].statusD
			a.TimeoutNS = uint64(10 * time.Second)
		}
		for it := 0; it < 10; it++ {
			var wg sync.WaitGroup
			for r := range args {
				wg.Add(1)
				go func(r int) {
					defer wg.Done()
					ok(t, lib.Barrier(0, &args[r], g.ranks[r].stream))
				}(r)
			}
			wg.Wait()
		}
		g.check(t, fmt.Sprint("barrier P=", p), nil)
		if p < 2 {
			continue
		}
		args[0].TimeoutNS = uint64(30 * time.Millisecond)
		ok(t, lib.Barrier(0, &args[0], g.ranks[0].stream))
		syncStream(t, lib, 0, g.ranks[0].stream)
		if w := atomic.LoadInt32((*int32)(g.ranks[0].status)); w&0xff != StatusTimeout || w>>8 == 0 {
			t.Errorf("P=%d: lone barrier status %#x, want a timeout naming a peer", p, w)
		}
	}
}

// A library that is not libslimecuda (libc) is refused, and the library
// already loaded keeps working: its calls still fail with their own text.
func TestLoadWrongThenRight(t *testing.T) {
	lib := openLib(t)
	t.Setenv("SLIME_TEST_LIB", "libc.so.6")
	if _, err := load(CUDALib, "SLIME_TEST_LIB", false); !errors.Is(err, ErrNotFound) {
		t.Fatalf("libc loaded: %v", err)
	}
	_, err := lib.Malloc(-1, 8)
	if err == nil || !strings.Contains(err.Error(), "cudaSetDevice") {
		t.Fatalf("the loaded library after a wrong one: %v", err)
	}
	t.Setenv("SLIME_TEST_LIB", os.Getenv("SLIME_CUDA_LIB"))
	if _, err := load(CUDALib, "SLIME_TEST_LIB", false); err != nil {
		t.Fatal(err)
	}
	if _, err := lib.DeviceName(0); err != nil {
		t.Fatal(err)
	}
}

// CUDA_DEVICE_MAX_CONNECTIONS is 32 once the library is loaded, unless the
// environment said otherwise.
func TestMaxConnections(t *testing.T) {
	openLib(t)
	if maxConnSet {
		t.Skip("CUDA_DEVICE_MAX_CONNECTIONS was set by the environment")
	}
	if v := os.Getenv("CUDA_DEVICE_MAX_CONNECTIONS"); v != MaxConnections {
		t.Fatalf("CUDA_DEVICE_MAX_CONNECTIONS = %q", v)
	}
}

// Lazy module loading, as the emulator models it: a kernel's first launch
// on a device waits for every stream of the device, so that it stalls
// behind a peer's kernel spinning for this rank until that kernel's
// timeout; slime_preload_kernels (and a first GEMM of the type) load ahead
// of time, and CUDA_MODULE_LOADING=EAGER loads everything at init; a
// cudaFree waiting as a first launch does frees no operand the launch has
// checked. Each case runs in a child process of its own (a fresh library: nothing
// loaded yet).
func TestEmuLazyLoading(t *testing.T) {
	lib := openLib(t)
	emuOnly(t, lib)
	if c := os.Getenv("SLIME_LAZY_CASE"); c != "" {
		lazyCase(t, lib, c)
		return
	}
	for _, c := range []string{"lazy", "preload", "eager", "free"} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestEmuLazyLoading$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), "SLIME_LAZY_CASE="+c, "CUDA_MODULE_LOADING=LAZY")
		if c == "eager" {
			cmd.Env = append(cmd.Env, "CUDA_MODULE_LOADING=EAGER")
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("%s: %v\n%s", c, err, out)
			continue
		}
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "first launches") || strings.Contains(l, "raced") {
				t.Logf("%s: %s", c, strings.TrimSpace(l))
			}
		}
	}
}

func lazyCase(t *testing.T, lib *Lib, c string) {
	const spin = 1500 * time.Millisecond
	g := newGroup(t, lib, []int{64, 64}, 256, 1)
	h, err := lib.BlasCreate(0)
	ok(t, err)
	defer lib.BlasDestroy(0, h)
	var m [3]Ptr
	for i := range m {
		m[i], err = lib.Malloc(0, 64)
		ok(t, err)
		ok(t, lib.Memset(0, m[i], 0, 64))
		defer lib.Free(0, m[i])
	}
	s, err := lib.StreamCreate(0)
	ok(t, err)
	defer lib.StreamDestroy(0, s)
	gemm := func() error { return lib.GemmF32(0, h, s, 4, 4, 4, m[0], 4, m[1], 4, m[2], 4) }
	if c == "preload" { // what a GPU group's setup and the overlap engine do
		ok(t, lib.PreloadKernels(0))
		ok(t, gemm())
		syncStream(t, lib, 0, s)
	}
	// Rank 1's LL kernel spins, waiting for rank 0.
	r1 := g.rounds(1, spin)
	ok(t, lib.AllGatherLL(0, &r1[0], 1, g.ranks[1].stream))
	time.Sleep(50 * time.Millisecond)
	if c == "free" {
		// A first GEMM waits for the device to load its function, and a
		// cudaFree of its output waits for the device too: whichever goes
		// on first when rank 1's kernel times out, the launch is enqueued
		// before the free (which then waits for it) or fails as an illegal
		// address; never a queued kernel writing freed memory.
		x, err := lib.Malloc(0, 64)
		ok(t, err)
		errc := make(chan error, 1)
		go func() { errc <- lib.GemmF32(0, h, s, 4, 4, 4, m[0], 4, m[1], 4, x, 4) }()
		time.Sleep(50 * time.Millisecond)
		ok(t, lib.Free(0, x))
		err = <-errc
		if err != nil && !strings.Contains(err.Error(), "cudaErrorIllegalAddress") {
			t.Fatalf("the GEMM: %v, want no error or cudaErrorIllegalAddress", err)
		}
		t.Logf("the GEMM raced with a cudaFree of its output: %v", err)
		syncStream(t, lib, 0, s)
		syncStream(t, lib, 0, g.ranks[1].stream)
		return
	}
	// Rank 0's first launches of the barrier kernel and of a GEMM.
	b := &BarrierArgs{Rank: 0, NRanks: 1, Epoch: g.ranks[0].counters + 24, Status: g.ranks[0].statusD, TimeoutNS: uint64(spin)}
	b.Flags[0] = g.ranks[0].region + Ptr(g.barrierOff())
	start := time.Now()
	ok(t, lib.Barrier(0, b, s))
	ok(t, gemm())
	took := time.Since(start)
	t.Logf("first launches took %v", took.Round(time.Millisecond))
	r0 := g.rounds(0, spin)
	ok(t, lib.AllGatherLL(0, &r0[0], 1, g.ranks[0].stream))
	syncStream(t, lib, 0, s)
	syncStream(t, lib, 0, g.ranks[0].stream)
	syncStream(t, lib, 0, g.ranks[1].stream)
	st := atomic.LoadInt32((*int32)(g.ranks[1].status))
	if c == "lazy" {
		if took < spin*2/3 || st&0xff != StatusTimeout {
			t.Fatalf("first launches took %v, rank 1's status %#x: want them held until rank 1's kernel timed out", took, st)
		}
		return
	}
	if took > spin/3 || st != 0 {
		t.Fatalf("first launches took %v, rank 1's status %#x: want no wait (loaded ahead), the gather done", took, st)
	}
}

// TestEmuFreeTwiceWhileBusy: two threads free the same device allocation
// while a kernel runs (cudaFree waits for it, letting go of the
// emulator's lock): one free succeeds, the other is cudaErrorInvalidValue,
// as a second cudaFree of a pointer is; the emulator must not unmap and
// close twice (a descriptor some other part of the process has opened by
// then) through the first free's stale entry.
func TestEmuFreeTwiceWhileBusy(t *testing.T) {
	lib := openLib(t)
	emuOnly(t, lib)
	const spin = 500 * time.Millisecond
	g := newGroup(t, lib, []int{64, 64}, 256, 1)
	x, err := lib.Malloc(0, 64)
	ok(t, err)
	// Rank 1's LL kernel spins, waiting for rank 0, until its timeout.
	r1 := g.rounds(1, spin)
	ok(t, lib.AllGatherLL(0, &r1[0], 1, g.ranks[1].stream))
	time.Sleep(50 * time.Millisecond)
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- lib.Free(0, x) }()
	}
	e1, e2 := <-errs, <-errs
	syncStream(t, lib, 0, g.ranks[1].stream)
	if (e1 == nil) == (e2 == nil) {
		t.Fatalf("two frees of one pointer: %v and %v, want one nil and one cudaErrorInvalidValue", e1, e2)
	}
	if e := cmp.Or(e1, e2); !strings.Contains(e.Error(), "cudaErrorInvalidValue") {
		t.Fatalf("the second free: %v, want cudaErrorInvalidValue", e)
	}
}
