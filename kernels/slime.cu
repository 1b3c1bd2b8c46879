// libslimecuda.so: the CUDA runtime calls, IPC, streams, events, graphs,
// the intra-node all-gather kernels and cuBLAS GEMM behind slime.h.
#include "slime.h"
#include "protocol.h"
#include "status.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mutex>

// A failed runtime call also leaves its error on the calling host thread,
// where the next cudaGetLastError returns it: a launch's check (below)
// would take it for its own. cgo runs goroutines on any thread, so one
// rank's refused call could fail another rank's good launch. The error
// is cleared here (a sticky one, a broken context, stays: every later
// call returns it anyway), and a launch clears what it finds before it
// launches.
static int cuda_fail(cudaError_t e, const char *what) {
    (void)cudaGetLastError();
    int code = SLIME_ERR_CUDA;
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) code = SLIME_ERR_NO_DEVICE;
    return fail(code, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

#define CK(call)                                                 \
    do {                                                         \
        cudaError_t e_ = (call);                                 \
        if (e_ != cudaSuccess) return cuda_fail(e_, #call);      \
    } while (0)

#define USE(dev) CK(cudaSetDevice(dev))

#define STREAM(s) ((cudaStream_t)(uintptr_t)(s))
#define EVENT(e) ((cudaEvent_t)(uintptr_t)(e))
#define PTR(p) ((void *)(uintptr_t)(p))

extern "C" {

const char *slime_last_error(void) { return last_error; }
int slime_abi_version(void) { return SLIME_ABI_VERSION; }
int slime_emulated(void) { return 0; }

int slime_device_count(int *count) {
    *count = 0;
    CK(cudaGetDeviceCount(count));
    return SLIME_OK;
}

int slime_device_name(int dev, char *buf, int len) {
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, dev));
    snprintf(buf, len, "%s", p.name);
    return SLIME_OK;
}

int slime_device_pci_bus_id(int dev, char *buf, int len) {
    CK(cudaDeviceGetPCIBusId(buf, len, dev));
    return SLIME_OK;
}

int slime_device_can_access_peer(int dev, int peer, int *ok) {
    *ok = 0;
    if (dev == peer) {
        *ok = 1;
        return SLIME_OK;
    }
    CK(cudaDeviceCanAccessPeer(ok, dev, peer));
    return SLIME_OK;
}

int slime_enable_peer_access(int dev, int peer) {
    USE(dev);
    cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();  // not sticky, but clear it
        return SLIME_OK;
    }
    if (e != cudaSuccess) return cuda_fail(e, "cudaDeviceEnablePeerAccess(peer, 0)");
    return SLIME_OK;
}

int slime_driver_version(int *version) {
    CK(cudaDriverGetVersion(version));
    return SLIME_OK;
}

int slime_runtime_version(int *version) {
    CK(cudaRuntimeGetVersion(version));
    return SLIME_OK;
}

int slime_malloc(int dev, uint64_t bytes, uint64_t *ptr) {
    void *p = NULL;
    USE(dev);
    CK(cudaMalloc(&p, bytes ? bytes : 1));
    *ptr = (uint64_t)(uintptr_t)p;
    return SLIME_OK;
}

int slime_free(int dev, uint64_t ptr) {
    USE(dev);
    CK(cudaFree(PTR(ptr)));
    return SLIME_OK;
}

int slime_host_alloc(int dev, uint64_t bytes, void **host, uint64_t *dptr) {
    void *h = NULL, *d = NULL;
    USE(dev);
    CK(cudaHostAlloc(&h, bytes ? bytes : 1, cudaHostAllocMapped | cudaHostAllocPortable));
    cudaError_t e = cudaHostGetDevicePointer(&d, h, 0);
    if (e != cudaSuccess) {
        cudaFreeHost(h);
        return cuda_fail(e, "cudaHostGetDevicePointer");
    }
    memset(h, 0, bytes);
    *host = h;
    *dptr = (uint64_t)(uintptr_t)d;
    return SLIME_OK;
}

int slime_host_free(int dev, void *host) {
    USE(dev);
    CK(cudaFreeHost(host));
    return SLIME_OK;
}

// The synchronous copies run on a non-blocking stream of the library's
// own per device, then synchronize it, so that they are done when they
// return. cudaMemcpy from pageable memory would return once the source is
// staged, its DMA landing later on the legacy stream, which orders none of
// slimego's (non-blocking) streams: their next work could read stale bytes.
// cudaMemset on device memory does not even wait for the host.
#define COPIER_DEVICES 64
static std::mutex copier_mu;
static cudaStream_t copier[COPIER_DEVICES];

static int copier_of(int dev, cudaStream_t *s) {
    if (dev < 0 || dev >= COPIER_DEVICES) return fail(SLIME_ERR_INVALID, "device %d (at most %d)", dev, COPIER_DEVICES);
    std::lock_guard<std::mutex> lk(copier_mu);
    if (!copier[dev]) CK(cudaStreamCreateWithFlags(&copier[dev], cudaStreamNonBlocking));
    *s = copier[dev];
    return SLIME_OK;
}

int slime_memcpy(int dev, uint64_t dst, uint64_t src, uint64_t bytes) {
    cudaStream_t s;
    USE(dev);
    int rc = copier_of(dev, &s);
    if (rc != SLIME_OK) return rc;
    CK(cudaMemcpyAsync(PTR(dst), PTR(src), bytes, cudaMemcpyDefault, s));
    CK(cudaStreamSynchronize(s));
    return SLIME_OK;
}

int slime_memcpy_async(int dev, uint64_t dst, uint64_t src, uint64_t bytes, uint64_t stream) {
    USE(dev);
    CK(cudaMemcpyAsync(PTR(dst), PTR(src), bytes, cudaMemcpyDefault, STREAM(stream)));
    return SLIME_OK;
}

int slime_memset(int dev, uint64_t dst, int value, uint64_t bytes) {
    cudaStream_t s;
    USE(dev);
    int rc = copier_of(dev, &s);
    if (rc != SLIME_OK) return rc;
    CK(cudaMemsetAsync(PTR(dst), value, bytes, s));
    CK(cudaStreamSynchronize(s));
    return SLIME_OK;
}

int slime_memset_async(int dev, uint64_t dst, int value, uint64_t bytes, uint64_t stream) {
    USE(dev);
    CK(cudaMemsetAsync(PTR(dst), value, bytes, STREAM(stream)));
    return SLIME_OK;
}

int slime_ipc_get_handle(int dev, uint64_t ptr, uint8_t handle[SLIME_IPC_HANDLE_BYTES]) {
    cudaIpcMemHandle_t h;
    USE(dev);
    CK(cudaIpcGetMemHandle(&h, PTR(ptr)));
    memcpy(handle, &h, sizeof h < SLIME_IPC_HANDLE_BYTES ? sizeof h : SLIME_IPC_HANDLE_BYTES);
    return SLIME_OK;
}

int slime_ipc_open(int dev, const uint8_t handle[SLIME_IPC_HANDLE_BYTES], uint64_t *ptr) {
    cudaIpcMemHandle_t h;
    void *p = NULL;
    USE(dev);
    memcpy(&h, handle, sizeof h);
    CK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
    *ptr = (uint64_t)(uintptr_t)p;
    return SLIME_OK;
}

int slime_ipc_close(int dev, uint64_t ptr) {
    USE(dev);
    CK(cudaIpcCloseMemHandle(PTR(ptr)));
    return SLIME_OK;
}

// cuMemGetAddressRange, found through the runtime (no link with libcuda):
// CUresult (CUdeviceptr *base, size_t *size, CUdeviceptr ptr).
typedef int (*mem_range_fn)(unsigned long long *, size_t *, unsigned long long);

int slime_mem_range(int dev, uint64_t ptr, uint64_t *base, uint64_t *size) {
    static mem_range_fn fn = NULL;
    static std::once_flag once;
    static cudaError_t found = cudaSuccess;
    unsigned long long b = 0;
    size_t n = 0;
    USE(dev);
    // A driver call needs the device's context current on this thread,
    // which cudaSetDevice alone does not make before CUDA 12.
    CK(cudaFree(0));
    std::call_once(once, [] {
        void *f = NULL;
#if CUDART_VERSION >= 12050
        cudaDriverEntryPointQueryResult q;
        found = cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &f, 3020, cudaEnableDefault, &q);
        if (found == cudaSuccess && q != cudaDriverEntryPointSuccess) found = cudaErrorSymbolNotFound;
#else
        found = cudaGetDriverEntryPoint("cuMemGetAddressRange", &f, cudaEnableDefault);
#endif
        fn = (mem_range_fn)f;
    });
    if (found != cudaSuccess || !fn) return cuda_fail(found != cudaSuccess ? found : cudaErrorSymbolNotFound, "cudaGetDriverEntryPoint(cuMemGetAddressRange)");
    int r = fn(&b, &n, (unsigned long long)ptr);
    if (r != 0) return fail(SLIME_ERR_CUDA, "cuMemGetAddressRange(%#llx): CUresult %d", (unsigned long long)ptr, r);
    *base = (uint64_t)b;
    *size = (uint64_t)n;
    return SLIME_OK;
}

int slime_stream_create(int dev, uint64_t *stream) {
    cudaStream_t s;
    USE(dev);
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *stream = (uint64_t)(uintptr_t)s;
    return SLIME_OK;
}

int slime_stream_destroy(int dev, uint64_t stream) {
    USE(dev);
    CK(cudaStreamDestroy(STREAM(stream)));
    return SLIME_OK;
}

int slime_stream_query(int dev, uint64_t stream) {
    USE(dev);
    cudaError_t e = cudaStreamQuery(STREAM(stream));
    if (e == cudaErrorNotReady) return SLIME_ERR_NOT_READY;
    if (e != cudaSuccess) return cuda_fail(e, "cudaStreamQuery");
    return SLIME_OK;
}

int slime_stream_wait_event(int dev, uint64_t stream, uint64_t event) {
    USE(dev);
    CK(cudaStreamWaitEvent(STREAM(stream), EVENT(event), 0));
    return SLIME_OK;
}

int slime_event_create(int dev, int timing, uint64_t *event) {
    cudaEvent_t ev;
    USE(dev);
    CK(cudaEventCreateWithFlags(&ev, timing ? cudaEventDefault : cudaEventDisableTiming));
    *event = (uint64_t)(uintptr_t)ev;
    return SLIME_OK;
}

int slime_event_destroy(int dev, uint64_t event) {
    USE(dev);
    CK(cudaEventDestroy(EVENT(event)));
    return SLIME_OK;
}

int slime_event_record(int dev, uint64_t event, uint64_t stream) {
    USE(dev);
    CK(cudaEventRecord(EVENT(event), STREAM(stream)));
    return SLIME_OK;
}

int slime_event_query(int dev, uint64_t event) {
    USE(dev);
    cudaError_t e = cudaEventQuery(EVENT(event));
    if (e == cudaErrorNotReady) return SLIME_ERR_NOT_READY;
    if (e != cudaSuccess) return cuda_fail(e, "cudaEventQuery");
    return SLIME_OK;
}

int slime_event_elapsed_ms(int dev, uint64_t start, uint64_t end, float *ms) {
    USE(dev);
    CK(cudaEventElapsedTime(ms, EVENT(start), EVENT(end)));
    return SLIME_OK;
}

int slime_graph_begin(int dev, uint64_t stream) {
    USE(dev);
    // Relaxed: other ranks of the process keep allocating and querying on
    // their own streams while this one captures.
    CK(cudaStreamBeginCapture(STREAM(stream), cudaStreamCaptureModeRelaxed));
    return SLIME_OK;
}

int slime_graph_end(int dev, uint64_t stream, uint64_t *exec) {
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    USE(dev);
    CK(cudaStreamEndCapture(STREAM(stream), &g));
    cudaError_t e = cudaGraphInstantiateWithFlags(&x, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) return cuda_fail(e, "cudaGraphInstantiate");
    *exec = (uint64_t)(uintptr_t)x;
    return SLIME_OK;
}

int slime_graph_launch(int dev, uint64_t exec, uint64_t stream) {
    USE(dev);
    CK(cudaGraphLaunch((cudaGraphExec_t)(uintptr_t)exec, STREAM(stream)));
    return SLIME_OK;
}

int slime_graph_destroy(int dev, uint64_t exec) {
    USE(dev);
    CK(cudaGraphExecDestroy((cudaGraphExec_t)(uintptr_t)exec));
    return SLIME_OK;
}

}  // extern "C"

// ---- device side: the protocol's bodies live in protocol.h, which the
// emulator compiles too -------------------------------------------------

__global__ void allgather_ll_kernel(slime_ag_args a) { slime_proto::allgather_ll(slime_proto::DevBlock(), a); }

__global__ void barrier_kernel(slime_barrier_args a) { slime_proto::barrier(slime_proto::DevBlock(), a); }

extern "C" {

int slime_allgather_ll(int dev, const slime_ag_args *args, int blocks, uint64_t stream) {
    if (args->nranks < 1 || args->nranks > SLIME_MAX_LOCAL || args->rank < 0 || args->rank >= args->nranks)
        return fail(SLIME_ERR_INVALID, "allgather: rank %d of %d (at most %d)", args->rank, args->nranks, SLIME_MAX_LOCAL);
    if (args->expect[args->rank] != args->bytes || args->bytes > args->cap)
        return fail(SLIME_ERR_INVALID, "allgather: own block of %llu bytes, layout says %llu, scratch holds %llu",
                    (unsigned long long)args->bytes, (unsigned long long)args->expect[args->rank],
                    (unsigned long long)args->cap);
    if (blocks < 1) blocks = 1;
    USE(dev);
    (void)cudaGetLastError();  // not this launch's (cuda_fail)
    allgather_ll_kernel<<<blocks, 512, 0, STREAM(stream)>>>(*args);
    CK(cudaGetLastError());
    return SLIME_OK;
}

int slime_barrier(int dev, const slime_barrier_args *args, uint64_t stream) {
    if (args->nranks < 1 || args->nranks > SLIME_MAX_LOCAL || args->rank < 0 || args->rank >= args->nranks)
        return fail(SLIME_ERR_INVALID, "barrier: rank %d of %d (at most %d)", args->rank, args->nranks, SLIME_MAX_LOCAL);
    USE(dev);
    (void)cudaGetLastError();  // not this launch's (cuda_fail)
    barrier_kernel<<<1, 64, 0, STREAM(stream)>>>(*args);
    CK(cudaGetLastError());
    return SLIME_OK;
}

// cudaFuncGetAttributes loads a function under lazy loading (CUDA's lazy
// loading guide: the way to preload kernels that must run concurrently).
int slime_preload_kernels(int dev) {
    USE(dev);
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, allgather_ll_kernel));
    CK(cudaFuncGetAttributes(&fa, barrier_kernel));
    return SLIME_OK;
}

static int blas_fail(cublasStatus_t s, const char *what) {
    return fail(SLIME_ERR_BLAS, "%s: cuBLAS status %d", what, (int)s);
}

#define BK(call)                                              \
    do {                                                      \
        cublasStatus_t s_ = (call);                           \
        if (s_ != CUBLAS_STATUS_SUCCESS) return blas_fail(s_, #call); \
    } while (0)

// A cuBLAS handle with its own workspace, so that GEMMs captured into a
// graph allocate nothing.
struct blas {
    cublasHandle_t h;
    void *ws;
};

#define BLAS_WORKSPACE (32u << 20)

int slime_blas_create(int dev, uint64_t *handle) {
    USE(dev);
    struct blas *b = (struct blas *)calloc(1, sizeof *b);
    if (!b) return fail(SLIME_ERR_BLAS, "out of host memory");
    cublasStatus_t st = cublasCreate(&b->h);
    if (st != CUBLAS_STATUS_SUCCESS) {
        free(b);
        return blas_fail(st, "cublasCreate");
    }
    cudaError_t e = cudaMalloc(&b->ws, BLAS_WORKSPACE);
    if (e == cudaSuccess) st = cublasSetWorkspace(b->h, b->ws, BLAS_WORKSPACE);
    if (e != cudaSuccess || st != CUBLAS_STATUS_SUCCESS) {
        cublasDestroy(b->h);
        if (b->ws) cudaFree(b->ws);
        free(b);
        return e != cudaSuccess ? cuda_fail(e, "cudaMalloc (cuBLAS workspace)") : blas_fail(st, "cublasSetWorkspace");
    }
    *handle = (uint64_t)(uintptr_t)b;
    return SLIME_OK;
}

int slime_blas_destroy(int dev, uint64_t handle) {
    struct blas *b = (struct blas *)(uintptr_t)handle;
    USE(dev);
    cublasStatus_t st = cublasDestroy(b->h);
    cudaError_t e = cudaFree(b->ws);
    free(b);
    if (st != CUBLAS_STATUS_SUCCESS) return blas_fail(st, "cublasDestroy");
    if (e != cudaSuccess) return cuda_fail(e, "cudaFree (cuBLAS workspace)");
    return SLIME_OK;
}

}  // extern "C"

static cublasStatus_t gemm_call(cublasHandle_t h, int m, int n, int k, const float *a, const float *b, int lda,
                                int ldb, float *c, int ldc) {
    const float one = 1, zero = 0;
    return cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &one, b, ldb, a, lda, &zero, c, ldc);
}

static cublasStatus_t gemm_call(cublasHandle_t h, int m, int n, int k, const double *a, const double *b, int lda,
                                int ldb, double *c, int ldc) {
    const double one = 1, zero = 0;
    return cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &one, b, ldb, a, lda, &zero, c, ldc);
}

// Row-major C = A.B is column-major C^T = B^T.A^T: the operands swap.
template <typename T>
static int gemm(int dev, uint64_t handle, uint64_t stream, int m, int n, int k, uint64_t a, int lda, uint64_t b,
                int ldb, uint64_t c, int ldc) {
    struct blas *bl = (struct blas *)(uintptr_t)handle;
    cublasHandle_t h = bl->h;
    USE(dev);
    BK(cublasSetStream(h, STREAM(stream)));
    // cublasSetStream drops the workspace set by cublasSetWorkspace (cuBLAS
    // would then allocate its own, which a captured graph must not, and
    // captured GEMMs could pick other kernels than eager ones): set it again.
    BK(cublasSetWorkspace(h, bl->ws, BLAS_WORKSPACE));
    BK(gemm_call(h, m, n, k, (const T *)PTR(a), (const T *)PTR(b), lda, ldb, (T *)PTR(c), ldc));
    return SLIME_OK;
}

extern "C" {

int slime_gemm_f32(int dev, uint64_t handle, uint64_t stream, int m, int n, int k,
                   uint64_t a, int lda, uint64_t b, int ldb, uint64_t c, int ldc) {
    return gemm<float>(dev, handle, stream, m, n, k, a, lda, b, ldb, c, ldc);
}

int slime_gemm_f64(int dev, uint64_t handle, uint64_t stream, int m, int n, int k,
                   uint64_t a, int lda, uint64_t b, int ldb, uint64_t c, int ldc) {
    return gemm<double>(dev, handle, stream, m, n, k, a, lda, b, ldb, c, ldc);
}

}  // extern "C"
