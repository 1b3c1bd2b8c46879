package kernels

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

var (
	// ErrNotFound: a library could not be loaded (not built, not on the
	// search path, or its dependencies missing).
	ErrNotFound = errors.New("kernels: library not found")
	// ErrUntrusted is with ErrNotFound (errors.Is) where a library was
	// found on the search path but passed over: others could have put it
	// there (see the search's rules in the README).
	ErrUntrusted = errors.New("kernels: library passed over: others could have put it there")
	// ErrNoDevice: the library loaded, but CUDA sees no GPU or no driver.
	ErrNoDevice = errors.New("kernels: no CUDA device")
	// ErrInvalid: the library refused an argument.
	ErrInvalid = errors.New("kernels: invalid argument")
	// ErrCUDA: a CUDA, cuBLAS or NVSHMEM call failed.
	ErrCUDA = errors.New("kernels: CUDA error")
)

// Error is a failed library call.
type Error struct {
	Call string // the slime_* function
	Code int    // its slime_status
	Msg  string // slime_last_error()
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s", e.Call, e.Msg) }

// Unwrap maps the status code to the package's sentinels.
func (e *Error) Unwrap() error {
	switch e.Code {
	case codeNoDevice:
		return ErrNoDevice
	case codeInvalid:
		return ErrInvalid
	}
	return ErrCUDA
}

// slime_status values (slime.h).
const (
	codeOK       = 0
	codeCUDA     = 1
	codeNoDevice = 2
	codeInvalid  = 3
	codeNotReady = 4
)

// Handles and device addresses, as the ABI passes them.
type (
	// Ptr is a device address.
	Ptr uint64
	// Stream is a cudaStream_t.
	Stream uint64
	// Event is a cudaEvent_t.
	Event uint64
	// Graph is an instantiated CUDA graph (cudaGraphExec_t).
	Graph uint64
	// Blas is a cuBLAS handle.
	Blas uint64
)

// MaxLocal is the most ranks of one node the intra-node kernels take.
const MaxLocal = 64

// IPCHandleBytes is the size of a CUDA IPC memory handle.
const IPCHandleBytes = 64

// Status word codes written by the kernels that wait for peers: the low
// byte is the code, the next the source rank.
const (
	StatusTimeout = 1
	StatusSize    = 2
)

// CounterBytes is the device memory (zeroed once) that a rank's
// all-gather counters need.
const CounterBytes = 64

// FlagBytes is the size of one rank's all-gather flag area for n ranks.
func FlagBytes(n int) uint64 { return 2 * uint64(n) * 2 * 8 }

// AllGatherArgs mirrors slime_ag_args: one launch (round) of the LL
// all-gather kernel. See slime.h for the protocol.
type AllGatherArgs struct {
	Rank, NRanks int32
	Cap          uint64
	Src          Ptr
	Bytes        uint64
	Total        uint64
	Dst          Ptr
	Off          [MaxLocal]uint64
	Expect       [MaxLocal]uint64
	Totals       [MaxLocal]uint64
	Scratch      [MaxLocal]Ptr
	Flags        [MaxLocal]Ptr
	Epoch        Ptr
	Sync         Ptr
	Status       Ptr
	TimeoutNS    uint64
}

// BarrierArgs mirrors slime_barrier_args.
type BarrierArgs struct {
	Rank, NRanks int32
	Flags        [MaxLocal]Ptr
	Epoch        Ptr
	Status       Ptr
	TimeoutNS    uint64
}

// NVSHMEMAllGatherArgs mirrors slime_nvshmem_ag_args.
type NVSHMEMAllGatherArgs struct {
	Rank, NRanks int32
	Src          Ptr
	Bytes        uint64
	Stage        Ptr
	Out          Ptr
	Sig          Ptr
	Epoch, Sync  Ptr
	Status       Ptr
	TimeoutNS    uint64
}

// Library file names.
const (
	CUDALib    = "libslimecuda.so"
	NVSHMEMLib = "libslimenvshmem.so"
	// EmuLib is the emulated libslimecuda (make kernels-emu), which
	// SLIME_CUDA_LIB can name.
	EmuLib = "libslimecuda-emu.so"
)

// MaxConnections is what CUDA_DEVICE_MAX_CONNECTIONS is set to, when it is
// unset, before the CUDA library loads: CUDA's default of 8 hardware
// queues per device lets in-process ranks' dependent work queue in front of
// the kernel another rank waits for.
const MaxConnections = "32"

// setMaxConnections sets CUDA_DEVICE_MAX_CONNECTIONS (unless set) before
// the library makes its first CUDA call, which reads it.
func setMaxConnections() {
	if _, ok := os.LookupEnv("CUDA_DEVICE_MAX_CONNECTIONS"); !ok {
		os.Setenv("CUDA_DEVICE_MAX_CONNECTIONS", MaxConnections)
	}
}

// candidates lists where to look for a library, in order: the variable
// that names it (SLIME_CUDA_LIB, SLIME_NVSHMEM_LIB), beside the executable,
// kernels/build one and two folders above the executable's (bin/ and
// bin/device/ of a checkout) and above the working directory, then the
// loader's own search (LD_LIBRARY_PATH, ldconfig).
func candidates(name, envVar string) []string {
	if p := os.Getenv(envVar); p != "" {
		return []string{p}
	}
	var c []string
	if exe, err := os.Executable(); err == nil {
		dir := filepath.Dir(exe)
		// bin/ and bin/device/ of a checkout
		c = append(c, filepath.Join(dir, name), filepath.Join(dir, "..", "kernels", "build", name),
			filepath.Join(dir, "..", "..", "kernels", "build", name))
	}
	if wd, err := os.Getwd(); err == nil {
		for d := wd; ; d = filepath.Dir(d) {
			c = append(c, filepath.Join(d, "kernels", "build", name))
			if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil || d == filepath.Dir(d) {
				break
			}
		}
	}
	// The executable's folders and the working directory's may reach the
	// same place (bin/slimerun run from its checkout): try it once.
	seen := map[string]bool{}
	out := c[:0]
	for _, p := range c {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return append(out, name)
}
