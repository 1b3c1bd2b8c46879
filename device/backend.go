package device

import (
	"context"
	"errors"
	"fmt"
	"unsafe"

	"github.com/slimego/slimego/kernels"
)

// The backend interfaces. Code written against them runs on either backend:
// the CPU one (host memory, goroutine streams) and the CUDA one (device
// memory, CUDA streams and events, on libslimecuda.so or its emulator).

// ErrMixedBackends: a call joined values of two backends (a CPU event on a
// CUDA stream, a host buffer in a GPU copy).
var ErrMixedBackends = errors.New("device: values of different backends")

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
	// synchronize that first).
	CopyIn(src []byte) error
	CopyOut(dst []byte) error
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
// row-major float32.
type GEMM interface {
	F32(s Stream, m, n, k int, a, b, c Buffer) error
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
	_ GEMM   = cpuGEMM{}
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
func (CPUDevice) NewGEMM() (GEMM, error)     { return cpuGEMM{}, nil }

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
	b   []byte
	sym bool
}

// NewHostBuffer wraps b, which symmetric says every rank of the node can
// address.
func NewHostBuffer(b []byte, symmetric bool) *HostBuffer { return &HostBuffer{b: b, sym: symmetric} }

// Bytes is the buffer's memory.
func (h *HostBuffer) Bytes() []byte            { return h.b }
func (h *HostBuffer) Kind() Kind               { return CPU }
func (h *HostBuffer) Size() int                { return len(h.b) }
func (h *HostBuffer) Symmetric() bool          { return h.sym }
func (h *HostBuffer) Free() error              { h.b = nil; return nil }
func (h *HostBuffer) CopyIn(src []byte) error  { return hostCopy(h.b, src) }
func (h *HostBuffer) CopyOut(dst []byte) error { return hostCopy(dst, h.b[:min(len(dst), len(h.b))]) }
func hostCopy(dst, src []byte) error {
	if len(src) > len(dst) {
		return fmt.Errorf("device: %d bytes into a %d-byte buffer", len(src), len(dst))
	}
	copy(dst, src)
	return nil
}

// cpuGEMM is a plain triple loop: the interface's reference, not a fast
// path (overlap's CPU executor uses gonum).
type cpuGEMM struct{}

func (cpuGEMM) Close() error { return nil }

func (cpuGEMM) F32(s Stream, m, n, k int, a, b, c Buffer) error {
	cs, ok := s.(*CPUStream)
	ha, ok1 := a.(*HostBuffer)
	hb, ok2 := b.(*HostBuffer)
	hc, ok3 := c.(*HostBuffer)
	if !ok || !ok1 || !ok2 || !ok3 {
		return fmt.Errorf("%w: cpu GEMM on %T", ErrMixedBackends, s)
	}
	if err := gemmFits(m, n, k, a, b, c); err != nil {
		return err
	}
	cs.Launch(func() error {
		A, B, C := f32(ha.b, m*k), f32(hb.b, k*n), f32(hc.b, m*n)
		for i := range m {
			for j := range n {
				var sum float32
				for l := range k {
					sum += A[i*k+l] * B[l*n+j]
				}
				C[i*n+j] = sum
			}
		}
		return nil
	})
	return nil
}

func gemmFits(m, n, k int, a, b, c Buffer) error {
	if m < 0 || n < 0 || k < 0 || a.Size() < 4*m*k || b.Size() < 4*k*n || c.Size() < 4*m*n {
		return fmt.Errorf("device: GEMM %d×%d×%d does not fit buffers of %d, %d and %d bytes", m, n, k, a.Size(), b.Size(), c.Size())
	}
	return nil
}

func f32(b []byte, n int) []float32 {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), n)
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

// F32 enqueues the product on s.
func (g *CUDAGEMM) F32(s Stream, m, n, k int, a, b, c Buffer) error {
	cs, ok := s.(*CUDAStream)
	da, ok1 := a.(*CUDABuffer)
	db, ok2 := b.(*CUDABuffer)
	dc, ok3 := c.(*CUDABuffer)
	if !ok || !ok1 || !ok2 || !ok3 {
		return fmt.Errorf("%w: cuda GEMM on %T", ErrMixedBackends, s)
	}
	if err := gemmFits(m, n, k, a, b, c); err != nil {
		return err
	}
	if m == 0 || n == 0 {
		return nil
	}
	return g.dev.lib.GemmF32(g.dev.Ordinal, g.h, cs.H, m, n, k, da.Ptr, max(k, 1), db.Ptr, n, dc.Ptr, n)
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

// CopyIn is CopyFromHost.
func (b *CUDABuffer) CopyIn(src []byte) error { return b.CopyFromHost(src) }

// CopyOut is CopyToHost.
func (b *CUDABuffer) CopyOut(dst []byte) error { return b.CopyToHost(dst) }
