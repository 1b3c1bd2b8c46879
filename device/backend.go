package device

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"unsafe"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas32"
	"gonum.org/v1/gonum/blas/blas64"

	"github.com/slimego/slimego/kernels"
)

// BLAS names the implementation the CPU backend's GEMMs run in: "gonum"
// (pure Go, the default) or "openblas" (built with -tags openblas and
// CGO_LDFLAGS=-lopenblas).
var BLAS = "gonum"

// The backend interfaces. Code written against them runs on either backend:
// the CPU one (host memory, goroutine streams) and the CUDA one (device
// memory, CUDA streams and events, on libslimecuda.so or its emulator).

// ErrMixedBackends: a call joined values of two backends (a CPU event on a
// CUDA stream, a host buffer in a GPU copy).
var ErrMixedBackends = errors.New("device: values of different backends")

// ErrFreed: a copy of (or a view into) a buffer that was freed.
var ErrFreed = errors.New("device: buffer freed")

// Device is one backend's device: it makes buffers, streams, events and
// GEMMs that work together.
type Device interface {
	Kind() Kind
	String() string
	// NewBuffer allocates n bytes of the device's memory (not symmetric:
	// symmetric memory comes from a node-local group).
	NewBuffer(n int) (Buffer, error)
	NewStream() (Stream, error)
	NewEvent() (Event, error)
	NewGEMM() (GEMM, error)
	// Copy enqueues on s a copy of src's bytes into the start of dst.
	Copy(s Stream, dst, src Buffer) error
}

// Buffer is memory of one backend.
type Buffer interface {
	Kind() Kind
	// Size is the buffer's length in bytes.
	Size() int
	// Symmetric says whether every rank of the node can address the
	// buffer (a shared-memory segment, IPC-mapped device memory).
	Symmetric() bool
	// CopyIn copies src from host memory into the start of the buffer,
	// and CopyOut the start of the buffer into dst, both synchronously
	// with respect to the host (not ordered after any stream's work:
	// synchronize that first). The host slice may be shorter than the
	// buffer (only its length is copied), never longer: src or dst of
	// more than Size bytes is an error, on both backends. A copy of a
	// freed buffer is ErrFreed.
	CopyIn(src []byte) error
	CopyOut(dst []byte) error
	// View is the n bytes at off, sharing the buffer's memory: a Buffer in
	// its own right, for every call that takes one (a GEMM on some rows of
	// a matrix, a copy, a plan's source). A view of a symmetric buffer is
	// symmetric. Freeing a view frees none of the buffer's memory (it
	// only makes the view unusable, as Free makes any Buffer value); the
	// view is valid while the buffer is. A view of a freed buffer is
	// ErrFreed.
	//
	// Sub-ranges are views rather than offsets in each call so that every
	// call keeps one shape (buffer, size) and checks its bounds in one
	// place, and so that an operator makes its views once, when it plans,
	// and then calls with them without allocating. (It is not named Slice
	// because [CUDABuffer.Slice] returns the concrete type, for callers
	// that need its device pointer.)
	View(off, n int) (Buffer, error)
	// Free releases the buffer's memory (a view's: none) and makes the
	// value unusable: Size is 0 after it, copies and views are ErrFreed.
	// A second Free is nil.
	Free() error
}

// Stream is an ordered queue of work of either backend.
type Stream interface {
	Synchronizer
	// Wait makes the work enqueued after it wait until e is reached.
	Wait(e Event) error
	Close() error
}

// Event marks a point in a stream's work, for another stream or the
// host to wait on.
type Event interface {
	// Record marks the point in s, which must be of the event's backend,
	// that the event stands for.
	Record(s Stream) error
	// Synchronize waits until the event is reached, or ctx ends.
	Synchronize(ctx context.Context) error
}

// GEMM multiplies matrices on a stream: C (m×n) = A (m×k) · B (k×n), all
// row-major and packed (A's rows k elements apart, B's and C's n), in the
// first bytes of a, b and c; an operand that starts elsewhere in a buffer
// is a view of it ([Buffer.View]). With k = 0 the product is zero, and C is
// written with zeros. F32 multiplies float32 elements, F64 float64. The
// buffers and s must be of the GEMM's backend (ErrMixedBackends otherwise);
// a shape larger than its buffers is an error before anything is enqueued
// (also where its byte counts overflow int), and so, on CUDA, is a
// dimension above math.MaxInt32 (cuBLAS takes int). The buffers and the
// stream of a CUDA GEMM must be of its GPU (ErrMixedBackends otherwise).
// An enqueued product allocates nothing once the GEMM has run as many
// products at once as it is given.
type GEMM interface {
	F32(s Stream, m, n, k int, a, b, c Buffer) error
	F64(s Stream, m, n, k int, a, b, c Buffer) error
	Close() error
}

var (
	_ Device = CPUDevice{}
	_ Device = (*GPU)(nil)
	_ Buffer = (*HostBuffer)(nil)
	_ Buffer = (*CUDABuffer)(nil)
	_ Stream = (*CPUStream)(nil)
	_ Stream = (*CUDAStream)(nil)
	_ Event  = (*CPUEvent)(nil)
	_ Event  = (*CUDAEvent)(nil)
	_ GEMM   = (*cpuGEMM)(nil)
	_ GEMM   = (*CUDAGEMM)(nil)
)

// CPUDevice is the CPU backend's device: host memory, goroutine streams.
type CPUDevice struct{}

func (CPUDevice) Kind() Kind     { return CPU }
func (CPUDevice) String() string { return "cpu" }

// NewBuffer allocates n bytes of host memory.
func (CPUDevice) NewBuffer(n int) (Buffer, error) {
	if n < 0 {
		return nil, fmt.Errorf("device: cpu alloc of %d bytes", n)
	}
	return &HostBuffer{b: make([]byte, n)}, nil
}

func (CPUDevice) NewStream() (Stream, error) { return NewCPUStream(), nil }
func (CPUDevice) NewEvent() (Event, error)   { return new(CPUEvent), nil }

// NewGEMM returns a GEMM of host memory on the BLAS that BLAS names.
func (CPUDevice) NewGEMM() (GEMM, error) { return &cpuGEMM{free: make(chan *cpuCall, cpuCalls)}, nil }

// Copy enqueues the copy on s, a CPU stream.
func (CPUDevice) Copy(s Stream, dst, src Buffer) error {
	cs, ok := s.(*CPUStream)
	d, ok2 := dst.(*HostBuffer)
	sb, ok3 := src.(*HostBuffer)
	if !ok || !ok2 || !ok3 {
		return fmt.Errorf("%w: cpu copy of %T into %T on %T", ErrMixedBackends, src, dst, s)
	}
	if sb.Size() > d.Size() {
		return fmt.Errorf("device: copy of %d bytes into a %d-byte buffer", sb.Size(), d.Size())
	}
	cs.Launch(func() error { copy(d.b, sb.b); return nil })
	return nil
}

// HostBuffer is CPU memory; a symmetric one is a view of a node's shared
// segment (see NewHostBuffer).
type HostBuffer struct {
	b     []byte
	sym   bool
	freed bool
}

// NewHostBuffer wraps b, which symmetric says every rank of the node can
// address.
func NewHostBuffer(b []byte, symmetric bool) *HostBuffer { return &HostBuffer{b: b, sym: symmetric} }

// Bytes is the buffer's memory.
func (h *HostBuffer) Bytes() []byte   { return h.b }
func (h *HostBuffer) Kind() Kind      { return CPU }
func (h *HostBuffer) Size() int       { return len(h.b) }
func (h *HostBuffer) Symmetric() bool { return h.sym }

// Free drops the buffer's memory (the garbage collector's, or the
// segment's owner's, to release): Size is 0 after it and copies are
// ErrFreed.
func (h *HostBuffer) Free() error { h.b, h.freed = nil, true; return nil }

// View is the n bytes at off (see Buffer.View).
func (h *HostBuffer) View(off, n int) (Buffer, error) {
	if h.freed {
		return nil, fmt.Errorf("%w: view [%d, +%d) of a freed host buffer", ErrFreed, off, n)
	}
	if err := inBounds("view", off, n, len(h.b)); err != nil {
		return nil, err
	}
	return &HostBuffer{b: h.b[off : off+n : off+n], sym: h.sym}, nil
}

// inBounds checks that [off, off+n) lies in size bytes, without forming
// off+n (which may overflow).
func inBounds(what string, off, n, size int) error {
	if off < 0 || off > size || n < 0 || n > size-off {
		return fmt.Errorf("device: %s of %d bytes at %d of a %d-byte buffer", what, n, off, size)
	}
	return nil
}

// CopyIn copies src into the start of the buffer (see Buffer.CopyIn).
func (h *HostBuffer) CopyIn(src []byte) error {
	if err := h.copyCheck("into", len(src)); err != nil {
		return err
	}
	copy(h.b, src)
	return nil
}

// CopyOut copies the start of the buffer into dst (see Buffer.CopyOut).
func (h *HostBuffer) CopyOut(dst []byte) error {
	if err := h.copyCheck("out of", len(dst)); err != nil {
		return err
	}
	copy(dst, h.b)
	return nil
}

func (h *HostBuffer) copyCheck(dir string, n int) error {
	if h.freed {
		return fmt.Errorf("%w: copy of %d bytes %s a freed host buffer", ErrFreed, n, dir)
	}
	if n > len(h.b) {
		return fmt.Errorf("device: %d bytes %s a %d-byte buffer", n, dir, len(h.b))
	}
	return nil
}

// cpuGEMM runs products of host memory on a CPU stream, in gonum's
// blas32 and blas64 (OpenBLAS under the openblas build tag, see BLAS).
// Each product is a cpuCall taken from a free list, whose function was
// made once, so that enqueuing one allocates nothing once the list holds
// as many calls as are in flight at a time.
type cpuGEMM struct{ free chan *cpuCall }

// cpuCalls bounds the free list: a product beyond it in flight at once
// still runs, on a call made for it.
const cpuCalls = 1024

// cpuCall is one enqueued product; fn (run, bound once) is what the
// stream runs.
type cpuCall struct {
	g       *cpuGEMM
	m, n, k int
	f64     bool
	a, b, c []byte
	fn      func() error
}

func (g *cpuGEMM) Close() error { return nil }

func (g *cpuGEMM) F32(s Stream, m, n, k int, a, b, c Buffer) error {
	return g.enqueue(s, m, n, k, a, b, c, false)
}

func (g *cpuGEMM) F64(s Stream, m, n, k int, a, b, c Buffer) error {
	return g.enqueue(s, m, n, k, a, b, c, true)
}

func (g *cpuGEMM) enqueue(s Stream, m, n, k int, a, b, c Buffer, f64 bool) error {
	cs, ok := s.(*CPUStream)
	ha, ok1 := a.(*HostBuffer)
	hb, ok2 := b.(*HostBuffer)
	hc, ok3 := c.(*HostBuffer)
	if !ok || !ok1 || !ok2 || !ok3 {
		return fmt.Errorf("%w: cpu GEMM on %T", ErrMixedBackends, s)
	}
	esz := 4
	if f64 {
		esz = 8
	}
	if err := gemmFits(m, n, k, esz, a, b, c); err != nil {
		return err
	}
	var call *cpuCall
	select {
	case call = <-g.free:
	default:
		call = &cpuCall{g: g}
		call.fn = call.run
	}
	call.m, call.n, call.k, call.f64 = m, n, k, f64
	call.a, call.b, call.c = ha.b, hb.b, hc.b
	cs.Launch(call.fn)
	return nil
}

// run computes the product, then returns the call to the free list.
func (call *cpuCall) run() error {
	m, n, k := call.m, call.n, call.k
	if call.f64 {
		gemmHost(f64s(call.a, m*k), f64s(call.b, k*n), f64s(call.c, m*n), m, n, k)
	} else {
		gemmHost(f32s(call.a, m*k), f32s(call.b, k*n), f32s(call.c, m*n), m, n, k)
	}
	call.a, call.b, call.c = nil, nil, nil
	select {
	case call.g.free <- call:
	default:
	}
	return nil
}

// gemmHost computes c (m × n) = a (m × k) · b (k × n), row-major, with
// the BLAS that BLAS names; with k = 0, c is zeroed.
func gemmHost[T float32 | float64](a, b, c []T, m, n, k int) {
	if m == 0 || n == 0 {
		return
	}
	if k == 0 {
		clear(c[:m*n])
		return
	}
	switch a := any(a).(type) {
	case []float32:
		blas32.Gemm(blas.NoTrans, blas.NoTrans, 1,
			blas32.General{Rows: m, Cols: k, Stride: k, Data: a},
			blas32.General{Rows: k, Cols: n, Stride: n, Data: any(b).([]float32)},
			0, blas32.General{Rows: m, Cols: n, Stride: n, Data: any(c).([]float32)})
	case []float64:
		blas64.Gemm(blas.NoTrans, blas.NoTrans, 1,
			blas64.General{Rows: m, Cols: k, Stride: k, Data: a},
			blas64.General{Rows: k, Cols: n, Stride: n, Data: any(b).([]float64)},
			0, blas64.General{Rows: m, Cols: n, Stride: n, Data: any(c).([]float64)})
	}
}

// MultiplyHost computes c (m × n) = a (m × k) · b (k × n), row-major, on
// the calling goroutine with the CPU GEMM's BLAS: the CPU backend's
// product without a stream, for references and host-side checks.
func MultiplyHost[T float32 | float64](a, b, c []T, m, n, k int) error {
	if m < 0 || n < 0 || k < 0 || len(a) < m*k || len(b) < k*n || len(c) < m*n {
		return fmt.Errorf("device: GEMM %d×%d×%d does not fit slices of %d, %d and %d elements", m, n, k, len(a), len(b), len(c))
	}
	gemmHost(a, b, c, m, n, k)
	return nil
}

// gemmFits checks that A (m×k), B (k×n) and C (m×n) of esz-byte elements
// fit a, b and c, with the byte counts computed without overflow (a shape
// whose counts do not fit in int fits no buffer).
func gemmFits(m, n, k, esz int, a, b, c Buffer) error {
	if m < 0 || n < 0 || k < 0 || !fits(a.Size(), esz, m, k) || !fits(b.Size(), esz, k, n) || !fits(c.Size(), esz, m, n) {
		return fmt.Errorf("device: GEMM %d×%d×%d of %d-byte elements does not fit buffers of %d, %d and %d bytes", m, n, k, esz, a.Size(), b.Size(), c.Size())
	}
	return nil
}

// fits says whether esz·x·y bytes (all three ≥ 0) are at most size.
func fits(size, esz, x, y int) bool {
	hi, xy := bits.Mul64(uint64(x), uint64(y))
	if hi != 0 {
		return false
	}
	hi, n := bits.Mul64(xy, uint64(esz))
	return hi == 0 && n <= uint64(size)
}

func f32s(b []byte, n int) []float32 {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), n)
}

func f64s(b []byte, n int) []float64 {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*float64)(unsafe.Pointer(&b[0])), n)
}

// Wait makes the work enqueued after it wait until e, a CPU event, is
// reached (see WaitEvent).
func (s *CPUStream) Wait(e Event) error {
	ce, ok := e.(*CPUEvent)
	if !ok {
		return fmt.Errorf("%w: %T on a cpu stream", ErrMixedBackends, e)
	}
	s.WaitEvent(ce)
	return nil
}

// Record marks e as reached once the work enqueued so far on s, a CPU
// stream, is done: the event-side form of CPUStream.Record.
func (e *CPUEvent) Record(s Stream) error {
	cs, ok := s.(*CPUStream)
	if !ok {
		return fmt.Errorf("%w: cpu event on %T", ErrMixedBackends, s)
	}
	cs.Record(e)
	return nil
}

// Kind is CUDA.
func (d *GPU) Kind() Kind { return CUDA }

// NewBuffer allocates n bytes of device memory.
func (d *GPU) NewBuffer(n int) (Buffer, error) {
	b, err := d.Alloc(n)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// NewStream creates a CUDA stream.
func (d *GPU) NewStream() (Stream, error) {
	s, err := d.NewCUDAStream()
	if err != nil {
		return nil, err
	}
	return s, nil
}

// NewEvent creates a CUDA event without timing.
func (d *GPU) NewEvent() (Event, error) {
	e, err := d.NewCUDAEvent(false)
	if err != nil {
		return nil, err
	}
	return e, nil
}

// Copy enqueues a device-to-device copy on s.
func (d *GPU) Copy(s Stream, dst, src Buffer) error {
	cs, ok := s.(*CUDAStream)
	db, ok2 := dst.(*CUDABuffer)
	sb, ok3 := src.(*CUDABuffer)
	if !ok || !ok2 || !ok3 {
		return fmt.Errorf("%w: cuda copy of %T into %T on %T", ErrMixedBackends, src, dst, s)
	}
	if err := d.owns("copy", cs, db, sb); err != nil {
		return err
	}
	if db.freed || sb.freed {
		return fmt.Errorf("%w: cuda copy of a freed buffer", ErrFreed)
	}
	if sb.Len > db.Len {
		return fmt.Errorf("device: copy of %d bytes into a %d-byte buffer", sb.Len, db.Len)
	}
	return d.lib.MemcpyAsync(d.Ordinal, db.Ptr, sb.Ptr, uint64(sb.Len), cs.H)
}

// CUDAGEMM is a cuBLAS handle of one GPU.
type CUDAGEMM struct {
	dev *GPU
	h   kernels.Blas
}

// NewGEMM creates a cuBLAS handle on d.
func (d *GPU) NewGEMM() (GEMM, error) {
	h, err := d.lib.BlasCreate(d.Ordinal)
	if err != nil {
		return nil, err
	}
	return &CUDAGEMM{dev: d, h: h}, nil
}

// F32 enqueues the float32 product on s.
func (g *CUDAGEMM) F32(s Stream, m, n, k int, a, b, c Buffer) error {
	return g.enqueue(s, m, n, k, a, b, c, 4)
}

// F64 enqueues the float64 product on s.
func (g *CUDAGEMM) F64(s Stream, m, n, k int, a, b, c Buffer) error {
	return g.enqueue(s, m, n, k, a, b, c, 8)
}

// enqueue checks the operands and enqueues cuBLAS's product, or, with k =
// 0, zeros into C (the product of an empty inner dimension).
func (g *CUDAGEMM) enqueue(s Stream, m, n, k int, a, b, c Buffer, esz int) error {
	cs, ok := s.(*CUDAStream)
	da, ok1 := a.(*CUDABuffer)
	db, ok2 := b.(*CUDABuffer)
	dc, ok3 := c.(*CUDABuffer)
	if !ok || !ok1 || !ok2 || !ok3 {
		return fmt.Errorf("%w: cuda GEMM on %T", ErrMixedBackends, s)
	}
	if err := g.dev.owns("GEMM", cs, da, db, dc); err != nil {
		return err
	}
	if err := gemmFits(m, n, k, esz, a, b, c); err != nil {
		return err
	}
	if m > math.MaxInt32 || n > math.MaxInt32 || k > math.MaxInt32 {
		return fmt.Errorf("device: cuda GEMM %d×%d×%d: cuBLAS takes dimensions up to %d", m, n, k, math.MaxInt32)
	}
	if m == 0 || n == 0 {
		return nil
	}
	if k == 0 {
		return g.dev.lib.MemsetAsync(g.dev.Ordinal, dc.Ptr, 0, uint64(m*n*esz), cs.H)
	}
	if esz == 8 {
		return g.dev.lib.GemmF64(g.dev.Ordinal, g.h, cs.H, m, n, k, da.Ptr, k, db.Ptr, n, dc.Ptr, n)
	}
	return g.dev.lib.GemmF32(g.dev.Ordinal, g.h, cs.H, m, n, k, da.Ptr, k, db.Ptr, n, dc.Ptr, n)
}

// owns checks that s and bufs are of d (by ordinal: OpenGPU makes a new
// *GPU per call), naming op: ErrMixedBackends otherwise.
func (d *GPU) owns(op string, s *CUDAStream, bufs ...*CUDABuffer) error {
	if s == nil || s.Dev == nil || s.Dev.Ordinal != d.Ordinal {
		return fmt.Errorf("%w: cuda %s of device %d on a stream of another device", ErrMixedBackends, op, d.Ordinal)
	}
	if err := s.usable(op); err != nil {
		return err
	}
	for _, b := range bufs {
		if b == nil || b.Dev == nil || b.Dev.Ordinal != d.Ordinal {
			return fmt.Errorf("%w: cuda %s of device %d with a buffer of another device", ErrMixedBackends, op, d.Ordinal)
		}
	}
	return nil
}

// Close destroys the handle.
func (g *CUDAGEMM) Close() error {
	if g.h == 0 {
		return nil
	}
	err := g.dev.lib.BlasDestroy(g.dev.Ordinal, g.h)
	g.h = 0
	return err
}

func (b *CUDABuffer) Kind() Kind      { return CUDA }
func (b *CUDABuffer) Size() int       { return b.Len }
func (b *CUDABuffer) Symmetric() bool { return false }

// View is Slice as a Buffer.
func (b *CUDABuffer) View(off, n int) (Buffer, error) {
	v, err := b.Slice(off, n)
	if err != nil {
		return nil, err
	}
	return v, nil
}

// CopyIn is CopyFromHost.
func (b *CUDABuffer) CopyIn(src []byte) error { return b.CopyFromHost(src) }

// CopyOut is CopyToHost.
func (b *CUDABuffer) CopyOut(dst []byte) error { return b.CopyToHost(dst) }
