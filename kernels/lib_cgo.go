//go:build cgo && linux

package kernels

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include "slime.h"

#define CUDA_FNS(X) \
  X(slime_last_error) X(slime_abi_version) X(slime_emulated) X(slime_device_count) X(slime_device_name) \
  X(slime_device_pci_bus_id) X(slime_device_can_access_peer) X(slime_enable_peer_access) X(slime_driver_version) \
  X(slime_runtime_version) X(slime_malloc) X(slime_free) X(slime_host_alloc) X(slime_host_free) \
  X(slime_memcpy) X(slime_memcpy_async) X(slime_memset) X(slime_memset_async) \
  X(slime_ipc_get_handle) X(slime_ipc_open) X(slime_ipc_close) X(slime_mem_range) X(slime_stream_create) \
  X(slime_stream_destroy) X(slime_stream_query) X(slime_stream_wait_event) X(slime_event_create) \
  X(slime_event_destroy) X(slime_event_record) X(slime_event_query) X(slime_event_elapsed_ms) \
  X(slime_graph_begin) X(slime_graph_end) X(slime_graph_launch) X(slime_graph_destroy) \
  X(slime_allgather_ll) X(slime_barrier) X(slime_preload_kernels) X(slime_blas_create) X(slime_blas_destroy) \
  X(slime_gemm_f32) X(slime_gemm_f64)

#define NVSHMEM_FNS(X) \
  X(slime_nvshmem_uid_bytes) X(slime_nvshmem_get_uid) X(slime_nvshmem_init) \
  X(slime_nvshmem_finalize) X(slime_nvshmem_malloc) X(slime_nvshmem_free) X(slime_nvshmem_allgather)

// The live tables: what the wrappers below call. open_lib resolves a
// library into a table of its own and copies it here only once every
// symbol is found, so that a wrong library leaves the loaded one working.
#define DECL(n) __typeof__(n) *p_##n;
struct cuda_fns { CUDA_FNS(DECL) };
struct nvshmem_fns { NVSHMEM_FNS(DECL) const char *(*p_nvshmem_last_error)(void); };
static struct cuda_fns cuda_live;
// Only the emulator has it (not in slime.h): the seed of its schedule.
static uint64_t (*p_emu_seed)(void);
static struct nvshmem_fns nvshmem_live;

// open_lib loads path and resolves every symbol; on failure *err says why
// and the live tables are untouched. For libslimecuda it first reads the
// library's slime_abi_version, where it has one: a library of another
// version is refused with *abi set to it (and *err NULL), before a symbol
// that its version lacks could be reported missing.
static void *open_lib(const char *path, int nvshmem, const char **err, int *abi) {
	*abi = SLIME_ABI_VERSION;
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) { *err = dlerror(); return NULL; }
	if (!nvshmem) {
		int (*version)(void) = (int (*)(void))dlsym(h, "slime_abi_version");
		if (version && (*abi = version()) != SLIME_ABI_VERSION) { *err = NULL; dlclose(h); return NULL; }
	}
#define LOAD(n) if (!(t.p_##n = (__typeof__(n) *)dlsym(h, #n))) { *err = "missing symbol " #n; dlclose(h); return NULL; }
	if (nvshmem) {
		struct nvshmem_fns t;
		NVSHMEM_FNS(LOAD)
		t.p_nvshmem_last_error = (const char *(*)(void))dlsym(h, "slime_last_error");
		if (!t.p_nvshmem_last_error) { *err = "missing symbol slime_last_error"; dlclose(h); return NULL; }
		nvshmem_live = t;
	} else {
		struct cuda_fns t;
		CUDA_FNS(LOAD)
		cuda_live = t;
		p_emu_seed = (uint64_t (*)(void))dlsym(h, "slime_emu_seed");
	}
	return h;
}

static const char *w_last_error(void) { return cuda_live.p_slime_last_error(); }
static const char *w_nvshmem_last_error(void) { return nvshmem_live.p_nvshmem_last_error(); }
static int w_emulated(void) { return cuda_live.p_slime_emulated(); }
static uint64_t w_emu_seed(void) { return p_emu_seed ? p_emu_seed() : 0; }
static int w_enable_peer_access(int d, int p) { return cuda_live.p_slime_enable_peer_access(d, p); }
static int w_device_count(int *c) { return cuda_live.p_slime_device_count(c); }
static int w_device_name(int d, char *b, int n) { return cuda_live.p_slime_device_name(d, b, n); }
static int w_device_pci_bus_id(int d, char *b, int n) { return cuda_live.p_slime_device_pci_bus_id(d, b, n); }
static int w_can_access_peer(int d, int p, int *ok) { return cuda_live.p_slime_device_can_access_peer(d, p, ok); }
static int w_driver_version(int *v) { return cuda_live.p_slime_driver_version(v); }
static int w_runtime_version(int *v) { return cuda_live.p_slime_runtime_version(v); }
static int w_malloc(int d, uint64_t n, uint64_t *p) { return cuda_live.p_slime_malloc(d, n, p); }
static int w_free(int d, uint64_t p) { return cuda_live.p_slime_free(d, p); }
static int w_host_alloc(int d, uint64_t n, void **h, uint64_t *p) { return cuda_live.p_slime_host_alloc(d, n, h, p); }
static int w_host_free(int d, void *h) { return cuda_live.p_slime_host_free(d, h); }
static int w_memcpy(int d, uint64_t dst, uint64_t src, uint64_t n) { return cuda_live.p_slime_memcpy(d, dst, src, n); }
static int w_memcpy_from_host(int d, uint64_t dst, void *src, uint64_t n) { return cuda_live.p_slime_memcpy(d, dst, (uint64_t)(uintptr_t)src, n); }
static int w_memcpy_to_host(int d, void *dst, uint64_t src, uint64_t n) { return cuda_live.p_slime_memcpy(d, (uint64_t)(uintptr_t)dst, src, n); }
static int w_memcpy_async(int d, uint64_t dst, uint64_t src, uint64_t n, uint64_t s) { return cuda_live.p_slime_memcpy_async(d, dst, src, n, s); }
static int w_memset(int d, uint64_t dst, int v, uint64_t n) { return cuda_live.p_slime_memset(d, dst, v, n); }
static int w_memset_async(int d, uint64_t dst, int v, uint64_t n, uint64_t s) { return cuda_live.p_slime_memset_async(d, dst, v, n, s); }
static int w_ipc_get_handle(int d, uint64_t p, void *h) { return cuda_live.p_slime_ipc_get_handle(d, p, (uint8_t *)h); }
static int w_ipc_open(int d, void *h, uint64_t *p) { return cuda_live.p_slime_ipc_open(d, (const uint8_t *)h, p); }
static int w_ipc_close(int d, uint64_t p) { return cuda_live.p_slime_ipc_close(d, p); }
static int w_mem_range(int d, uint64_t p, uint64_t *b, uint64_t *n) { return cuda_live.p_slime_mem_range(d, p, b, n); }
static int w_stream_create(int d, uint64_t *s) { return cuda_live.p_slime_stream_create(d, s); }
static int w_stream_destroy(int d, uint64_t s) { return cuda_live.p_slime_stream_destroy(d, s); }
static int w_stream_query(int d, uint64_t s) { return cuda_live.p_slime_stream_query(d, s); }
static int w_stream_wait_event(int d, uint64_t s, uint64_t e) { return cuda_live.p_slime_stream_wait_event(d, s, e); }
static int w_event_create(int d, int t, uint64_t *e) { return cuda_live.p_slime_event_create(d, t, e); }
static int w_event_destroy(int d, uint64_t e) { return cuda_live.p_slime_event_destroy(d, e); }
static int w_event_record(int d, uint64_t e, uint64_t s) { return cuda_live.p_slime_event_record(d, e, s); }
static int w_event_query(int d, uint64_t e) { return cuda_live.p_slime_event_query(d, e); }
static int w_event_elapsed_ms(int d, uint64_t a, uint64_t b, float *ms) { return cuda_live.p_slime_event_elapsed_ms(d, a, b, ms); }
static int w_graph_begin(int d, uint64_t s) { return cuda_live.p_slime_graph_begin(d, s); }
static int w_graph_end(int d, uint64_t s, uint64_t *x) { return cuda_live.p_slime_graph_end(d, s, x); }
static int w_graph_launch(int d, uint64_t x, uint64_t s) { return cuda_live.p_slime_graph_launch(d, x, s); }
static int w_graph_destroy(int d, uint64_t x) { return cuda_live.p_slime_graph_destroy(d, x); }
static int w_allgather_ll(int d, void *a, int blocks, uint64_t s) { return cuda_live.p_slime_allgather_ll(d, (const slime_ag_args *)a, blocks, s); }
static int w_barrier(int d, void *a, uint64_t s) { return cuda_live.p_slime_barrier(d, (const slime_barrier_args *)a, s); }
static int w_preload_kernels(int d) { return cuda_live.p_slime_preload_kernels(d); }
static int w_blas_create(int d, uint64_t *h) { return cuda_live.p_slime_blas_create(d, h); }
static int w_blas_destroy(int d, uint64_t h) { return cuda_live.p_slime_blas_destroy(d, h); }
static int w_gemm_f32(int d, uint64_t h, uint64_t s, int m, int n, int k, uint64_t a, int lda, uint64_t b, int ldb, uint64_t c, int ldc) { return cuda_live.p_slime_gemm_f32(d, h, s, m, n, k, a, lda, b, ldb, c, ldc); }
static int w_gemm_f64(int d, uint64_t h, uint64_t s, int m, int n, int k, uint64_t a, int lda, uint64_t b, int ldb, uint64_t c, int ldc) { return cuda_live.p_slime_gemm_f64(d, h, s, m, n, k, a, lda, b, ldb, c, ldc); }
static int w_nvshmem_uid_bytes(void) { return nvshmem_live.p_slime_nvshmem_uid_bytes(); }
static int w_nvshmem_get_uid(void *u) { return nvshmem_live.p_slime_nvshmem_get_uid((uint8_t *)u); }
static int w_nvshmem_init(int d, void *u, int r, int n) { return nvshmem_live.p_slime_nvshmem_init(d, (const uint8_t *)u, r, n); }
static int w_nvshmem_finalize(void) { return nvshmem_live.p_slime_nvshmem_finalize(); }
static int w_nvshmem_malloc(uint64_t n, uint64_t *p) { return nvshmem_live.p_slime_nvshmem_malloc(n, p); }
static int w_nvshmem_free(uint64_t p) { return nvshmem_live.p_slime_nvshmem_free(p); }
static int w_nvshmem_allgather(int d, void *a, uint64_t s) { return nvshmem_live.p_slime_nvshmem_allgather(d, (const slime_nvshmem_ag_args *)a, s); }
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"unsafe"
)

// The Go mirrors must match the C structs byte for byte.
var (
	_ [unsafe.Sizeof(AllGatherArgs{}) - C.sizeof_slime_ag_args]byte
	_ [C.sizeof_slime_ag_args - unsafe.Sizeof(AllGatherArgs{})]byte
	_ [unsafe.Sizeof(BarrierArgs{}) - C.sizeof_slime_barrier_args]byte
	_ [C.sizeof_slime_barrier_args - unsafe.Sizeof(BarrierArgs{})]byte
	_ [unsafe.Sizeof(NVSHMEMAllGatherArgs{}) - C.sizeof_slime_nvshmem_ag_args]byte
	_ [C.sizeof_slime_nvshmem_ag_args - unsafe.Sizeof(NVSHMEMAllGatherArgs{})]byte
	_ [MaxLocal - C.SLIME_MAX_LOCAL]byte
	_ [C.SLIME_MAX_LOCAL - MaxLocal]byte
)

// Lib is libslimecuda.so, loaded. Its methods are safe for concurrent use.
type Lib struct {
	path     string
	emulated bool
}

var (
	cudaOnce sync.Once
	cudaLib  *Lib
	cudaErr  error
	nvOnce   sync.Once
	nvLib    *NVSHMEM
	nvErr    error
	loadMu   sync.Mutex // dlerror is not thread-safe
)

func load(name, envVar string, nvshmem bool) (string, error) {
	loadMu.Lock()
	defer loadMu.Unlock()
	var tried []string
	flag := C.int(0)
	if nvshmem {
		flag = 1
	}
	if !nvshmem {
		setMaxConnections()
	}
	explicit := os.Getenv(envVar) != ""
	untrusted := false
	for _, p := range candidates(name, envVar) {
		if !explicit && strings.ContainsRune(p, '/') {
			// Found on the search path: opened only where nobody but this
			// user and root can have put it (see trustedLib).
			if _, err := os.Lstat(p); err != nil {
				tried = append(tried, fmt.Sprintf("%s: %v", p, errors.Unwrap(err)))
				continue
			}
			real, err := trustedLib(p)
			if err != nil {
				tried = append(tried, fmt.Sprintf("%s: not loaded: %v", p, err))
				untrusted = true
				continue
			}
			p = real
		}
		cp := C.CString(p)
		var msg *C.char
		var abi C.int
		h := C.open_lib(cp, flag, &msg, &abi)
		C.free(unsafe.Pointer(cp))
		if h != nil {
			return p, nil
		}
		if abi != C.SLIME_ABI_VERSION {
			tried = append(tried, fmt.Sprintf("%s has ABI version %d, this program wants %d: rebuild it (make kernels)", p, int(abi), C.SLIME_ABI_VERSION))
			continue
		}
		m := C.GoString(msg)
		if !strings.Contains(m, p) {
			m = p + ": " + m
		}
		tried = append(tried, m)
	}
	err := fmt.Errorf("%w: %s (set %s to its path, or run make kernels): %s", ErrNotFound, name, envVar, strings.Join(tried, "; "))
	if untrusted {
		err = fmt.Errorf("%w (%w)", err, ErrUntrusted)
	}
	return "", err
}

// Open loads libslimecuda.so once (see the package doc for where it looks),
// of this program's ABI version: a library of another version is passed
// over, and named with its version in the error where no place has a
// library to load. It does not touch a GPU; [Lib.DeviceCount] does.
func Open() (*Lib, error) {
	cudaOnce.Do(func() {
		path, err := load(CUDALib, "SLIME_CUDA_LIB", false)
		if err != nil {
			cudaErr = err
			return
		}
		cudaLib = &Lib{path: path, emulated: C.w_emulated() != 0}
	})
	return cudaLib, cudaErr
}

// Path is the file the library was loaded from.
func (l *Lib) Path() string { return l.path }

// Emulated says whether the library is the emulator (libslimecuda-emu.so:
// host threads, no GPU), whose figures are no GPU's.
func (l *Lib) Emulated() bool { return l.emulated }

// EmuSeed is the emulator's SLIME_EMU_SEED (or the random seed it drew),
// which replays a failing schedule; 0 for a GPU library.
func (l *Lib) EmuSeed() uint64 { return uint64(C.w_emu_seed()) }

// EnablePeerAccess lets kernels on dev touch peer's memory: in-process
// ranks on different GPUs need it (memory mapped with IPC does not).
// Enabling it twice is no error.
func (l *Lib) EnablePeerAccess(dev, peer int) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return check(C.w_enable_peer_access(C.int(dev), C.int(peer)), "slime_enable_peer_access")
}

// check turns a return code into an error. The caller holds its OS thread
// locked since the call, so that slime_last_error is the call's.
func check(rc C.int, call string) error {
	if rc == codeOK {
		return nil
	}
	return &Error{Call: call, Code: int(rc), Msg: C.GoString(C.w_last_error())}
}

// ErrNotReady is what a query returns while the work runs.
var ErrNotReady = errors.New("kernels: not ready")

// DeviceCount is the number of GPUs CUDA sees; no GPU or no driver is an
// error wrapping ErrNoDevice.
func (l *Lib) DeviceCount() (int, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var n C.int
	if err := check(C.w_device_count(&n), "slime_device_count"); err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, &Error{Call: "slime_device_count", Code: codeNoDevice, Msg: "CUDA reports no device"}
	}
	return int(n), nil
}

func (l *Lib) text(dev int, call string, f func(C.int, *C.char, C.int) C.int) (string, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	buf := make([]byte, 256)
	if err := check(f(C.int(dev), (*C.char)(unsafe.Pointer(&buf[0])), C.int(len(buf))), call); err != nil {
		return "", err
	}
	return C.GoString((*C.char)(unsafe.Pointer(&buf[0]))), nil
}

// DeviceName is the GPU's name ("NVIDIA H200").
func (l *Lib) DeviceName(dev int) (string, error) {
	return l.text(dev, "slime_device_name", func(d C.int, b *C.char, n C.int) C.int { return C.w_device_name(d, b, n) })
}

// PCIBusID is the GPU's PCI address, as NVML spells it.
func (l *Lib) PCIBusID(dev int) (string, error) {
	return l.text(dev, "slime_device_pci_bus_id", func(d C.int, b *C.char, n C.int) C.int { return C.w_device_pci_bus_id(d, b, n) })
}

// CanAccessPeer says whether dev can map peer's memory (true for dev == peer).
func (l *Lib) CanAccessPeer(dev, peer int) (bool, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var ok C.int
	err := check(C.w_can_access_peer(C.int(dev), C.int(peer), &ok), "slime_device_can_access_peer")
	return ok != 0, err
}

// Versions are the driver's and the runtime's CUDA versions (1000·major + 10·minor).
func (l *Lib) Versions() (driver, rt int, err error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var d, r C.int
	if err := check(C.w_driver_version(&d), "slime_driver_version"); err != nil {
		return 0, 0, err
	}
	err = check(C.w_runtime_version(&r), "slime_runtime_version")
	return int(d), int(r), err
}

// Malloc allocates device memory.
func (l *Lib) Malloc(dev int, n uint64) (Ptr, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var p C.uint64_t
	err := check(C.w_malloc(C.int(dev), C.uint64_t(n), &p), "slime_malloc")
	return Ptr(p), err
}

// Free releases device memory.
func (l *Lib) Free(dev int, p Ptr) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return check(C.w_free(C.int(dev), C.uint64_t(p)), "slime_free")
}

// HostAlloc allocates zeroed pinned host memory mapped into the device:
// host for the CPU, dev for kernels.
func (l *Lib) HostAlloc(dev int, n uint64) (host unsafe.Pointer, dptr Ptr, err error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var h unsafe.Pointer
	var p C.uint64_t
	err = check(C.w_host_alloc(C.int(dev), C.uint64_t(n), &h, &p), "slime_host_alloc")
	return h, Ptr(p), err
}

// HostFree releases memory from HostAlloc.
func (l *Lib) HostFree(dev int, host unsafe.Pointer) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return check(C.w_host_free(C.int(dev), host), "slime_host_free")
}

// Memcpy copies n bytes between device (or mapped) addresses and returns
// when the copy is done.
func (l *Lib) Memcpy(dev int, dst, src Ptr, n uint64) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return check(C.w_memcpy(C.int(dev), C.uint64_t(dst), C.uint64_t(src), C.uint64_t(n)), "slime_memcpy")
}

// CopyFromHost copies src into device memory at dst.
func (l *Lib) CopyFromHost(dev int, dst Ptr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return check(C.w_memcpy_from_host(C.int(dev), C.uint64_t(dst), unsafe.Pointer(&src[0]), C.uint64_t(len(src))), "slime_memcpy")
}

// CopyToHost copies len(dst) bytes of device memory at src into dst.
func (l *Lib) CopyToHost(dev int, dst []byte, src Ptr) error {
	if len(dst) == 0 {
		return nil
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return check(C.w_memcpy_to_host(C.int(dev), unsafe.Pointer(&dst[0]), C.uint64_t(src), C.uint64_t(len(dst))), "slime_memcpy")
}

// MemcpyAsync enqueues a copy on s.
func (l *Lib) MemcpyAsync(dev int, dst, src Ptr, n uint64, s Stream) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return check(C.w_memcpy_async(C.int(dev), C.uint64_t(dst), C.uint64_t(src), C.uint64_t(n), C.uint64_t(s)), "slime_memcpy_async")
}

// Memset fills n bytes at dst with v.
func (l *Lib) Memset(dev int, dst Ptr, v byte, n uint64) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return check(C.w_memset(C.int(dev), C.uint64_t(dst), C.int(v), C.uint64_t(n)), "slime_memset")
}

// MemsetAsync enqueues a fill on s.
func (l *Lib) MemsetAsync(dev int, dst Ptr, v byte, n uint64, s Stream) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return check(C.w_memset_async(C.int(dev), C.uint64_t(dst), C.int(v), C.uint64_t(n), C.uint64_t(s)), "slime_memset_async")
}

// IPCHandle exports the allocation that starts at p.
func (l *Lib) IPCHandle(dev int, p Ptr) ([IPCHandleBytes]byte, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var h [IPCHandleBytes]byte
	err := check(C.w_ipc_get_handle(C.int(dev), C.uint64_t(p), unsafe.Pointer(&h[0])), "slime_ipc_get_handle")
	return h, err
}

// IPCOpen maps another process's allocation.
func (l *Lib) IPCOpen(dev int, h [IPCHandleBytes]byte) (Ptr, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var p C.uint64_t
	err := check(C.w_ipc_open(C.int(dev), unsafe.Pointer(&h[0]), &p), "slime_ipc_open")
	return Ptr(p), err
}

// IPCClose unmaps what IPCOpen mapped.
func (l *Lib) IPCClose(dev int, p Ptr) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return check(C.w_ipc_close(C.int(dev), C.uint64_t(p)), "slime_ipc_close")
}

// MemRange is the allocation of device memory that holds p (this
// process's, or one IPCOpen mapped): its start and size.
func (l *Lib) MemRange(dev int, p Ptr) (Ptr, uint64, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var b, n C.uint64_t
	err := check(C.w_mem_range(C.int(dev), C.uint64_t(p), &b, &n), "slime_mem_range")
	return Ptr(b), uint64(n), err
}

// StreamCreate makes a non-blocking stream.
func (l *Lib) StreamCreate(dev int) (Stream, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var s C.uint64_t
	err := check(C.w_stream_create(C.int(dev), &s), "slime_stream_create")
	return Stream(s), err
}

// StreamDestroy releases a stream.
func (l *Lib) StreamDestroy(dev int, s Stream) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return check(C.w_stream_destroy(C.int(dev), C.uint64_t(s)), "slime_stream_destroy")
}

// StreamQuery returns nil once the stream's work is done, ErrNotReady
// before.
func (l *Lib) StreamQuery(dev int, s Stream) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	rc := C.w_stream_query(C.int(dev), C.uint64_t(s))
	if rc == codeNotReady {
		return ErrNotReady
	}
	return check(rc, "slime_stream_query")
}

// StreamWaitEvent makes s's later work wait for e.
func (l *Lib) StreamWaitEvent(dev int, s Stream, e Event) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return check(C.w_stream_wait_event(C.int(dev), C.uint64_t(s), C.uint64_t(e)), "slime_stream_wait_event")
}

// EventCreate makes an event; timing ones can be measured with EventElapsed.
func (l *Lib) EventCreate(dev int, timing bool) (Event, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	t := C.int(0)
	if timing {
		t = 1
	}
	var e C.uint64_t
	err := check(C.w_event_create(C.int(dev), t, &e), "slime_event_create")
	return Event(e), err
}

// EventDestroy releases an event.
func (l *Lib) EventDestroy(dev int, e Event) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return check(C.w_event_destroy(C.int(dev), C.uint64_t(e)), "slime_event_destroy")
}

// EventRecord records e on s.
func (l *Lib) EventRecord(dev int, e Event, s Stream) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return check(C.w_event_record(C.int(dev), C.uint64_t(e), C.uint64_t(s)), "slime_event_record")
}

// EventQuery returns nil once e is reached, ErrNotReady before.
func (l *Lib) EventQuery(dev int, e Event) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	rc := C.w_event_query(C.int(dev), C.uint64_t(e))
	if rc == codeNotReady {
		return ErrNotReady
	}
	return check(rc, "slime_event_query")
}

// EventElapsed is the time between two reached timing events, in ms.
func (l *Lib) EventElapsed(dev int, start, end Event) (float32, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var ms C.float
	err := check(C.w_event_elapsed_ms(C.int(dev), C.uint64_t(start), C.uint64_t(end), &ms), "slime_event_elapsed_ms")
	return float32(ms), err
}

// GraphBegin starts capturing s (relaxed mode).
func (l *Lib) GraphBegin(dev int, s Stream) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return check(C.w_graph_begin(C.int(dev), C.uint64_t(s)), "slime_graph_begin")
}

// GraphEnd ends the capture of s and instantiates it.
func (l *Lib) GraphEnd(dev int, s Stream) (Graph, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var x C.uint64_t
	err := check(C.w_graph_end(C.int(dev), C.uint64_t(s), &x), "slime_graph_end")
	return Graph(x), err
}

// GraphLaunch enqueues a replay of g on s.
func (l *Lib) GraphLaunch(dev int, g Graph, s Stream) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return check(C.w_graph_launch(C.int(dev), C.uint64_t(g), C.uint64_t(s)), "slime_graph_launch")
}

// GraphDestroy releases g.
func (l *Lib) GraphDestroy(dev int, g Graph) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return check(C.w_graph_destroy(C.int(dev), C.uint64_t(g)), "slime_graph_destroy")
}

// AllGatherLL enqueues one round of the LL all-gather kernel on s with
// the given number of thread blocks.
func (l *Lib) AllGatherLL(dev int, a *AllGatherArgs, blocks int, s Stream) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return check(C.w_allgather_ll(C.int(dev), unsafe.Pointer(a), C.int(blocks), C.uint64_t(s)), "slime_allgather_ll")
}

// Barrier enqueues the flag barrier kernel on s.
func (l *Lib) Barrier(dev int, a *BarrierArgs, s Stream) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return check(C.w_barrier(C.int(dev), unsafe.Pointer(a), C.uint64_t(s)), "slime_barrier")
}

// PreloadKernels loads the library's kernels (the all-gather's and the
// barrier's) on dev now, rather than at their first launch: under CUDA's
// lazy module loading a first launch waits for every stream of the
// device, and one that comes while a peer's kernel on the same device
// spins waiting for this rank stalls both until the kernel's timeout. A
// GPU group calls it at its setup, before any peer can launch; it may
// wait for the device's work itself.
func (l *Lib) PreloadKernels(dev int) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return check(C.w_preload_kernels(C.int(dev)), "slime_preload_kernels")
}

// BlasCreate makes a cuBLAS handle for dev.
func (l *Lib) BlasCreate(dev int) (Blas, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var h C.uint64_t
	err := check(C.w_blas_create(C.int(dev), &h), "slime_blas_create")
	return Blas(h), err
}

// BlasDestroy releases a cuBLAS handle.
func (l *Lib) BlasDestroy(dev int, h Blas) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return check(C.w_blas_destroy(C.int(dev), C.uint64_t(h)), "slime_blas_destroy")
}

// GemmF32 enqueues row-major C (m×n) = A (m×k)·B (k×n) on s.
func (l *Lib) GemmF32(dev int, h Blas, s Stream, m, n, k int, a Ptr, lda int, b Ptr, ldb int, c Ptr, ldc int) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return check(C.w_gemm_f32(C.int(dev), C.uint64_t(h), C.uint64_t(s), C.int(m), C.int(n), C.int(k),
		C.uint64_t(a), C.int(lda), C.uint64_t(b), C.int(ldb), C.uint64_t(c), C.int(ldc)), "slime_gemm_f32")
}

// GemmF64 is GemmF32 in double precision.
func (l *Lib) GemmF64(dev int, h Blas, s Stream, m, n, k int, a Ptr, lda int, b Ptr, ldb int, c Ptr, ldc int) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return check(C.w_gemm_f64(C.int(dev), C.uint64_t(h), C.uint64_t(s), C.int(m), C.int(n), C.int(k),
		C.uint64_t(a), C.int(lda), C.uint64_t(b), C.int(ldb), C.uint64_t(c), C.int(ldc)), "slime_gemm_f64")
}

// NVSHMEM is libslimenvshmem.so, loaded.
type NVSHMEM struct {
	path string
}

// OpenNVSHMEM loads libslimenvshmem.so once (SLIME_NVSHMEM_LIB, or the
// places [Open] looks).
func OpenNVSHMEM() (*NVSHMEM, error) {
	nvOnce.Do(func() {
		path, err := load(NVSHMEMLib, "SLIME_NVSHMEM_LIB", true)
		if err != nil {
			nvErr = err
			return
		}
		nvLib = &NVSHMEM{path: path}
	})
	return nvLib, nvErr
}

// Path is the file the library was loaded from.
func (n *NVSHMEM) Path() string { return n.path }

func nvcheck(rc C.int, call string) error {
	if rc == codeOK {
		return nil
	}
	return &Error{Call: call, Code: int(rc), Msg: C.GoString(C.w_nvshmem_last_error())}
}

// UniqueID makes the bootstrap id that rank 0 hands to every rank.
func (n *NVSHMEM) UniqueID() ([]byte, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	uid := make([]byte, int(C.w_nvshmem_uid_bytes()))
	err := nvcheck(C.w_nvshmem_get_uid(unsafe.Pointer(&uid[0])), "slime_nvshmem_get_uid")
	return uid, err
}

// Init joins the NVSHMEM job as rank of nranks with the id from rank 0.
func (n *NVSHMEM) Init(dev int, uid []byte, rank, nranks int) error {
	if len(uid) != int(C.w_nvshmem_uid_bytes()) {
		return &Error{Call: "slime_nvshmem_init", Code: codeInvalid, Msg: fmt.Sprintf("unique id of %d bytes", len(uid))}
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return nvcheck(C.w_nvshmem_init(C.int(dev), unsafe.Pointer(&uid[0]), C.int(rank), C.int(nranks)), "slime_nvshmem_init")
}

// Finalize leaves the NVSHMEM job.
func (n *NVSHMEM) Finalize() error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return nvcheck(C.w_nvshmem_finalize(), "slime_nvshmem_finalize")
}

// Malloc allocates from the symmetric heap (collective).
func (n *NVSHMEM) Malloc(bytes uint64) (Ptr, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var p C.uint64_t
	err := nvcheck(C.w_nvshmem_malloc(C.uint64_t(bytes), &p), "slime_nvshmem_malloc")
	return Ptr(p), err
}

// Free returns symmetric memory (collective).
func (n *NVSHMEM) Free(p Ptr) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return nvcheck(C.w_nvshmem_free(C.uint64_t(p)), "slime_nvshmem_free")
}

// AllGather enqueues the put-with-signal all-gather on s.
func (n *NVSHMEM) AllGather(dev int, a *NVSHMEMAllGatherArgs, s Stream) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return nvcheck(C.w_nvshmem_allgather(C.int(dev), unsafe.Pointer(a), C.uint64_t(s)), "slime_nvshmem_allgather")
}
