//go:build !cgo || !linux

package kernels

import (
	"errors"
	"fmt"
	"unsafe"
)

// Without cgo (or off Linux) the libraries cannot be loaded: Open and
// OpenNVSHMEM report ErrNotFound, and nothing else can be reached.

var errNoCgo = fmt.Errorf("%w: this build has no cgo, which loading the GPU libraries needs (build with CGO_ENABLED=1 on Linux)", ErrNotFound)

// ErrNotReady is what a query returns while the work runs.
var ErrNotReady = errors.New("kernels: not ready")

// Lib is libslimecuda.so, loaded; without cgo there is none.
type Lib struct{}

// Open reports that this build cannot load the library.
func Open() (*Lib, error) { return nil, errNoCgo }

// NVSHMEM is libslimenvshmem.so, loaded; without cgo there is none.
type NVSHMEM struct{}

// OpenNVSHMEM reports that this build cannot load the library.
func OpenNVSHMEM() (*NVSHMEM, error) { return nil, errNoCgo }

func (l *Lib) DeviceCount() (int, error) { return 0, errNoCgo }

// Emulated says whether the library is the emulator; without cgo there is none.
func (l *Lib) Emulated() bool { return false }

func (l *Lib) EnablePeerAccess(dev, peer int) error { return errNoCgo }

// EmuSeed is the emulator's seed; without cgo there is none.
func (l *Lib) EmuSeed() uint64 { return 0 }

func (l *Lib) DeviceName(dev int) (string, error) { return "", errNoCgo }

func (l *Lib) PCIBusID(dev int) (string, error) { return "", errNoCgo }

func (l *Lib) CanAccessPeer(dev, peer int) (bool, error) { return false, errNoCgo }

func (l *Lib) Versions() (driver, rt int, err error) { return 0, 0, errNoCgo }

func (l *Lib) Malloc(dev int, n uint64) (Ptr, error) { return 0, errNoCgo }

func (l *Lib) Free(dev int, p Ptr) error { return errNoCgo }

func (l *Lib) HostAlloc(dev int, n uint64) (host unsafe.Pointer, dptr Ptr, err error) {
	return nil, 0, errNoCgo
}

func (l *Lib) HostFree(dev int, host unsafe.Pointer) error { return errNoCgo }

func (l *Lib) Memcpy(dev int, dst, src Ptr, n uint64) error { return errNoCgo }

func (l *Lib) CopyFromHost(dev int, dst Ptr, src []byte) error { return errNoCgo }

func (l *Lib) CopyToHost(dev int, dst []byte, src Ptr) error { return errNoCgo }

func (l *Lib) MemcpyAsync(dev int, dst, src Ptr, n uint64, s Stream) error { return errNoCgo }

func (l *Lib) Memset(dev int, dst Ptr, v byte, n uint64) error { return errNoCgo }

func (l *Lib) MemsetAsync(dev int, dst Ptr, v byte, n uint64, s Stream) error { return errNoCgo }

func (l *Lib) IPCHandle(dev int, p Ptr) ([IPCHandleBytes]byte, error) {
	return [IPCHandleBytes]byte{}, errNoCgo
}

func (l *Lib) IPCOpen(dev int, h [IPCHandleBytes]byte) (Ptr, error) { return 0, errNoCgo }

func (l *Lib) IPCClose(dev int, p Ptr) error { return errNoCgo }

func (l *Lib) MemRange(dev int, p Ptr) (Ptr, uint64, error) { return 0, 0, errNoCgo }

func (l *Lib) StreamCreate(dev int) (Stream, error) { return 0, errNoCgo }

func (l *Lib) StreamDestroy(dev int, s Stream) error { return errNoCgo }

func (l *Lib) StreamQuery(dev int, s Stream) error { return errNoCgo }

func (l *Lib) StreamWaitEvent(dev int, s Stream, e Event) error { return errNoCgo }

func (l *Lib) EventCreate(dev int, timing bool) (Event, error) { return 0, errNoCgo }

func (l *Lib) EventDestroy(dev int, e Event) error { return errNoCgo }

func (l *Lib) EventRecord(dev int, e Event, s Stream) error { return errNoCgo }

func (l *Lib) EventQuery(dev int, e Event) error { return errNoCgo }

func (l *Lib) EventElapsed(dev int, start, end Event) (float32, error) { return 0, errNoCgo }

func (l *Lib) GraphBegin(dev int, s Stream) error { return errNoCgo }

func (l *Lib) GraphEnd(dev int, s Stream) (Graph, error) { return 0, errNoCgo }

func (l *Lib) GraphLaunch(dev int, g Graph, s Stream) error { return errNoCgo }

func (l *Lib) GraphDestroy(dev int, g Graph) error { return errNoCgo }

func (l *Lib) AllGatherLL(dev int, a *AllGatherArgs, blocks int, s Stream) error { return errNoCgo }

func (l *Lib) Barrier(dev int, a *BarrierArgs, s Stream) error { return errNoCgo }

func (l *Lib) PreloadKernels(dev int) error { return errNoCgo }

func (l *Lib) BlasCreate(dev int) (Blas, error) { return 0, errNoCgo }

func (l *Lib) BlasDestroy(dev int, h Blas) error { return errNoCgo }

func (l *Lib) GemmF32(dev int, h Blas, s Stream, m, n, k int, a Ptr, lda int, b Ptr, ldb int, c Ptr, ldc int) error {
	return errNoCgo
}

func (l *Lib) GemmF64(dev int, h Blas, s Stream, m, n, k int, a Ptr, lda int, b Ptr, ldb int, c Ptr, ldc int) error {
	return errNoCgo
}

func (n *NVSHMEM) UniqueID() ([]byte, error) { return nil, errNoCgo }

func (n *NVSHMEM) Init(dev int, uid []byte, rank, nranks int) error { return errNoCgo }

func (n *NVSHMEM) Finalize() error { return errNoCgo }

func (n *NVSHMEM) Malloc(bytes uint64) (Ptr, error) { return 0, errNoCgo }

func (n *NVSHMEM) Free(p Ptr) error { return errNoCgo }

func (n *NVSHMEM) AllGather(dev int, a *NVSHMEMAllGatherArgs, s Stream) error { return errNoCgo }

// Path is the file the library was loaded from.
func (l *Lib) Path() string { return "" }

// Path is the file the library was loaded from.
func (n *NVSHMEM) Path() string { return "" }
