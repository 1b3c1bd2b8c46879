package device

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/slimego/slimego/kernels"
)

// Synchronizer is what the host waits on: a stream of either backend.
type Synchronizer interface {
	// Synchronize returns once the work enqueued so far is done, with its
	// first error, or an error wrapping ErrWaitTimeout when ctx ends first
	// (a CUDA stream's wraps ctx's error as well).
	Synchronize(ctx context.Context) error
}

var (
	_ Synchronizer = (*CPUStream)(nil)
	_ Synchronizer = (*CUDAStream)(nil)
)

var (
	cudaOnce  sync.Once
	cudaCount int
	cudaErr   error
)

// CUDAAvailable says why the CUDA backend cannot run here (nil if it can):
// libslimecuda.so is not found, or CUDA sees no GPU.
func CUDAAvailable() error {
	_, err := CUDADeviceCount()
	return err
}

// CUDADeviceCount is the number of GPUs, once the library loads.
func CUDADeviceCount() (int, error) {
	cudaOnce.Do(func() {
		lib, err := kernels.Open()
		if err != nil {
			cudaErr = err
			return
		}
		cudaCount, cudaErr = lib.DeviceCount()
	})
	return cudaCount, cudaErr
}

// CUDAEmulated says whether the CUDA library that loads is the emulator
// (libslimecuda-emu.so: host threads standing in for a GPU, for tests). No
// figure measured on it is a GPU's, and it is no reason for the automatic
// backend choice to leave the CPU.
func CUDAEmulated() bool {
	lib, err := kernels.Open()
	return err == nil && lib.Emulated()
}

// GPU is one CUDA device. Its methods are safe for concurrent use; every call
// selects the device itself, so goroutines may move between threads.
type GPU struct {
	Ordinal int
	Name    string
	BusID   string // PCI address, as NVML spells it
	lib     *kernels.Lib
}

// OpenGPU opens GPU ordinal (0 ≤ ordinal < CUDADeviceCount).
func OpenGPU(ordinal int) (*GPU, error) {
	n, err := CUDADeviceCount()
	if err != nil {
		return nil, fmt.Errorf("%w: cuda: %v", ErrUnavailable, err)
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("%w: cuda: device %d of %d", ErrUnavailable, ordinal, n)
	}
	lib, _ := kernels.Open()
	d := &GPU{Ordinal: ordinal, lib: lib}
	if d.Name, err = lib.DeviceName(ordinal); err != nil {
		return nil, err
	}
	if d.BusID, err = lib.PCIBusID(ordinal); err != nil {
		return nil, err
	}
	return d, nil
}

// OpenLocalGPU opens the GPU of the rank that is localRank-th on its node:
// GPU localRank mod the devices there are (several ranks may share one).
func OpenLocalGPU(localRank int) (*GPU, error) {
	n, err := CUDADeviceCount()
	if err == nil && n < 1 {
		err = errors.New("no device")
	}
	if err != nil {
		return nil, fmt.Errorf("%w: cuda: %v", ErrUnavailable, err)
	}
	return OpenGPU(localRank % n)
}

// Emulated says whether d is the emulator's stand-in for a GPU.
func (d *GPU) Emulated() bool { return d.lib.Emulated() }

// Lib is the loaded library, for the kernels' own calls.
func (d *GPU) Lib() *kernels.Lib { return d.lib }

func (d *GPU) String() string { return fmt.Sprintf("cuda:%d (%s, %s)", d.Ordinal, d.Name, d.BusID) }

// CUDABuffer is device memory: an allocation (Alloc) or a view of one
// (Slice, View), which shares its memory and releases none of it.
type CUDABuffer struct {
	Dev *GPU
	Ptr kernels.Ptr
	Len int

	view  bool        // made by Slice: Free releases nothing
	freed bool        // Free was called: Len is 0, copies are ErrFreed
	root  *CUDABuffer // a view's allocation (nil for an allocation)
}

// Freed reports whether the buffer's memory is gone: Free was called on
// it or, for a view (Slice), on the allocation it lies in. A plan over
// the buffer asks before each run.
func (b *CUDABuffer) Freed() bool {
	return b.freed || b.root != nil && b.root.freed
}

// Alloc allocates n bytes of device memory.
func (d *GPU) Alloc(n int) (*CUDABuffer, error) {
	if n < 0 {
		return nil, fmt.Errorf("device: cuda alloc of %d bytes", n)
	}
	p, err := d.lib.Malloc(d.Ordinal, uint64(n))
	if err != nil {
		return nil, err
	}
	return &CUDABuffer{Dev: d, Ptr: p, Len: n}, nil
}

// Free releases the allocation (once); on a view (Slice) it releases
// nothing, the parent owning the memory. Either way the value is unusable
// after it: Len is 0 and copies are ErrFreed (see Buffer.Free).
func (b *CUDABuffer) Free() error {
	if b == nil || b.freed {
		return nil
	}
	p := b.Ptr
	b.Ptr, b.Len, b.freed = 0, 0, true
	if b.view || p == 0 {
		return nil
	}
	return b.Dev.lib.Free(b.Dev.Ordinal, p)
}

// Slice is the n bytes at off, sharing the memory: a view, whose Free
// releases nothing.
func (b *CUDABuffer) Slice(off, n int) (*CUDABuffer, error) {
	if b.freed {
		return nil, fmt.Errorf("%w: slice [%d, +%d) of a freed cuda buffer", ErrFreed, off, n)
	}
	if err := inBounds("slice", off, n, b.Len); err != nil {
		return nil, err
	}
	root := b.root
	if root == nil && !b.view {
		root = b
	}
	return &CUDABuffer{Dev: b.Dev, Ptr: b.Ptr + kernels.Ptr(off), Len: n, view: true, root: root}, nil
}

// CopyFromHost copies src into the start of the buffer.
func (b *CUDABuffer) CopyFromHost(src []byte) error {
	if err := b.copyCheck("into", len(src)); err != nil {
		return err
	}
	return b.Dev.lib.CopyFromHost(b.Dev.Ordinal, b.Ptr, src)
}

// CopyToHost copies the start of the buffer into dst.
func (b *CUDABuffer) CopyToHost(dst []byte) error {
	if err := b.copyCheck("out of", len(dst)); err != nil {
		return err
	}
	return b.Dev.lib.CopyToHost(b.Dev.Ordinal, dst, b.Ptr)
}

func (b *CUDABuffer) copyCheck(dir string, n int) error {
	if b.freed {
		return fmt.Errorf("%w: copy of %d bytes %s a freed cuda buffer", ErrFreed, n, dir)
	}
	if n > b.Len {
		return fmt.Errorf("device: %d bytes %s a %d-byte buffer", n, dir, b.Len)
	}
	return nil
}

// CUDAStream is a CUDA stream (non-blocking with respect to the legacy
// default stream).
type CUDAStream struct {
	Dev *GPU
	H   kernels.Stream

	// closed is set by Close, which zeroes H: handle 0 names the device's
	// legacy stream, so that a closed stream's work would run there,
	// unordered. Every call on a closed stream is ErrStreamClosed instead.
	closed bool
}

// usable is nil, or ErrStreamClosed naming what for a closed stream.
func (s *CUDAStream) usable(what string) error {
	if s.closed {
		return fmt.Errorf("%w: %s on a closed cuda stream", ErrStreamClosed, what)
	}
	return nil
}

// NewCUDAStream creates a stream on d.
func (d *GPU) NewCUDAStream() (*CUDAStream, error) {
	h, err := d.lib.StreamCreate(d.Ordinal)
	if err != nil {
		return nil, err
	}
	return &CUDAStream{Dev: d, H: h}, nil
}

// Synchronize polls until the stream's work is done, or ctx ends (an error
// wrapping ErrWaitTimeout). It spins for a few microseconds, then yields,
// then sleeps, so that short collectives answer fast and long ones leave
// the CPU to others. It allocates nothing.
func (s *CUDAStream) Synchronize(ctx context.Context) error {
	return s.SynchronizeBy(ctx, time.Time{})
}

// SynchronizeBy is Synchronize that also gives up at deadline (unless it
// is zero): a bound per call that needs no context of its own.
func (s *CUDAStream) SynchronizeBy(ctx context.Context, deadline time.Time) error {
	if err := s.usable("synchronize"); err != nil {
		return err
	}
	return poll(ctx, deadline, func() error { return s.Dev.lib.StreamQuery(s.Dev.Ordinal, s.H) })
}

// Wait makes the stream's later work wait until e, a CUDA event, is
// reached.
func (s *CUDAStream) Wait(e Event) error {
	ce, ok := e.(*CUDAEvent)
	if !ok {
		return fmt.Errorf("%w: %T on a cuda stream", ErrMixedBackends, e)
	}
	if err := s.usable("wait"); err != nil {
		return err
	}
	return s.Dev.lib.StreamWaitEvent(s.Dev.Ordinal, s.H, ce.H)
}

// Close destroys the stream.
func (s *CUDAStream) Close() error {
	if s == nil || s.closed {
		return nil
	}
	s.closed = true
	if s.H == 0 {
		return nil
	}
	err := s.Dev.lib.StreamDestroy(s.Dev.Ordinal, s.H)
	s.H = 0
	return err
}

// CUDAEvent is a CUDA event.
type CUDAEvent struct {
	Dev *GPU
	H   kernels.Event
}

// NewCUDAEvent creates an event; timing events can be measured with Elapsed.
func (d *GPU) NewCUDAEvent(timing bool) (*CUDAEvent, error) {
	h, err := d.lib.EventCreate(d.Ordinal, timing)
	if err != nil {
		return nil, err
	}
	return &CUDAEvent{Dev: d, H: h}, nil
}

// Record marks the point in s, a CUDA stream, that e stands for.
func (e *CUDAEvent) Record(s Stream) error {
	cs, ok := s.(*CUDAStream)
	if !ok {
		return fmt.Errorf("%w: cuda event on %T", ErrMixedBackends, s)
	}
	if err := cs.usable("record"); err != nil {
		return err
	}
	return e.Dev.lib.EventRecord(e.Dev.Ordinal, e.H, cs.H)
}

// Synchronize polls until e is reached, or ctx ends.
func (e *CUDAEvent) Synchronize(ctx context.Context) error {
	return poll(ctx, time.Time{}, func() error { return e.Dev.lib.EventQuery(e.Dev.Ordinal, e.H) })
}

// Since is the time from start to e, both reached timing events.
func (e *CUDAEvent) Since(start *CUDAEvent) (time.Duration, error) {
	ms, err := e.Dev.lib.EventElapsed(e.Dev.Ordinal, start.H, e.H)
	return time.Duration(float64(ms) * float64(time.Millisecond)), err
}

// Close destroys the event.
func (e *CUDAEvent) Close() error {
	if e == nil || e.H == 0 {
		return nil
	}
	err := e.Dev.lib.EventDestroy(e.Dev.Ordinal, e.H)
	e.H = 0
	return err
}

// poll repeats query until it stops answering kernels.ErrNotReady: spinning
// for 20 µs, yielding up to 1 ms, then sleeping 50 µs at a time; the
// context and the deadline (if not zero) are checked between polls.
func poll(ctx context.Context, deadline time.Time, query func() error) error {
	start := time.Now()
	for i := 0; ; i++ {
		err := query()
		if !errors.Is(err, kernels.ErrNotReady) {
			return err
		}
		if i&63 == 0 {
			if cerr := ctx.Err(); cerr != nil {
				// ctx's error too: a caller tells a cancellation from a
				// deadline by it.
				return fmt.Errorf("%w: the GPU's work was not done after %v: %w", ErrWaitTimeout, time.Since(start).Round(time.Millisecond), cerr)
			}
			if !deadline.IsZero() && time.Now().After(deadline) {
				return fmt.Errorf("%w: the GPU's work was not done after %v", ErrWaitTimeout, time.Since(start).Round(time.Millisecond))
			}
		}
		pause(start)
	}
}

// UseEmulator points the CUDA backend at the emulated library
// (libslimecuda-emu.so, built on first use) unless SLIME_CUDA_LIB names a
// library already; devices > 0 asks for that many emulated GPUs (see
// kernels.UseEmulator). It is for the TestMains of the packages above
// device, so that their GPU tests run on a machine without one and
// without importing the loader themselves. Call it before anything opens
// the CUDA library.
func UseEmulator(devices int) error { return kernels.UseEmulator(devices) }
