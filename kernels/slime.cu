// libslimecuda.so: the CUDA runtime calls, IPC, streams, events, graphs,
// the intra-node all-gather kernels and cuBLAS GEMM behind slime.h.
#include "slime.h"
#include "status.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cuda_fail(cudaError_t e, const char *what) {
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

int slime_memcpy(int dev, uint64_t dst, uint64_t src, uint64_t bytes) {
    USE(dev);
    CK(cudaMemcpy(PTR(dst), PTR(src), bytes, cudaMemcpyDefault));
    return SLIME_OK;
}

int slime_memcpy_async(int dev, uint64_t dst, uint64_t src, uint64_t bytes, uint64_t stream) {
    USE(dev);
    CK(cudaMemcpyAsync(PTR(dst), PTR(src), bytes, cudaMemcpyDefault, STREAM(stream)));
    return SLIME_OK;
}

int slime_memset(int dev, uint64_t dst, int value, uint64_t bytes) {
    USE(dev);
    CK(cudaMemset(PTR(dst), value, bytes));
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

// ---- device side ----------------------------------------------------------

__device__ __forceinline__ void st_release_sys(uint64_t *p, uint64_t v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t *p) {
    uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ uint64_t now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// copy n bytes with the whole grid (thread t of nth): 16-byte vectors where
// source and destination share their alignment, 4-byte words or bytes
// otherwise. Fresh (data other GPUs or ranks wrote during this kernel) is
// loaded around L1, which is not coherent.
template <bool Fresh>
__device__ void grid_copy(char *dst, const char *src, uint64_t n, uint64_t t, uint64_t nth) {
    if (n == 0 || dst == src) return;
    if ((((uintptr_t)dst ^ (uintptr_t)src) & 15) == 0) {
        uint64_t head = (16 - ((uintptr_t)dst & 15)) & 15;
        if (head > n) head = n;
        for (uint64_t i = t; i < head; i += nth) dst[i] = Fresh ? __ldcg(src + i) : src[i];
        uint64_t vecs = (n - head) / 16;
        int4 *d4 = (int4 *)(dst + head);
        const int4 *s4 = (const int4 *)(src + head);
        for (uint64_t i = t; i < vecs; i += nth) d4[i] = Fresh ? __ldcg(s4 + i) : s4[i];
        for (uint64_t i = head + vecs * 16 + t; i < n; i += nth) dst[i] = Fresh ? __ldcg(src + i) : src[i];
    } else if ((((uintptr_t)dst ^ (uintptr_t)src) & 3) == 0) {
        uint64_t head = (4 - ((uintptr_t)dst & 3)) & 3;
        if (head > n) head = n;
        for (uint64_t i = t; i < head; i += nth) dst[i] = Fresh ? __ldcg(src + i) : src[i];
        uint64_t words = (n - head) / 4;
        uint32_t *d = (uint32_t *)(dst + head);
        const uint32_t *s = (const uint32_t *)(src + head);
        for (uint64_t i = t; i < words; i += nth) d[i] = Fresh ? __ldcg(s + i) : s[i];
        for (uint64_t i = head + words * 4 + t; i < n; i += nth) dst[i] = Fresh ? __ldcg(src + i) : src[i];
    } else {
        for (uint64_t i = t; i < n; i += nth) dst[i] = Fresh ? __ldcg(src + i) : src[i];
    }
}

// Record a failure. The word is mapped host memory, where atomics need
// PCIe atomics that not every host has: a plain store, the first writer
// usually winning, any code being a correct report.
__device__ void set_status(uint64_t status, int code, int src) {
    volatile int *w = (volatile int *)PTR(status);
    if (*w == 0) *w = code | (src << 8);
    __threadfence_system();
}

__device__ bool failed(uint64_t status) { return *(volatile int *)PTR(status) != 0; }

// Thread 0 of a block waits until *flag satisfies the test against e; the
// whole block learns whether to go on.
template <bool Exact>
__device__ bool block_wait(const uint64_t *flag, uint64_t e, uint64_t status, int src, uint64_t timeout_ns) {
    __shared__ int go;
    if (threadIdx.x == 0) {
        go = 1;
        uint64_t start = now_ns();
        for (unsigned polls = 1;; polls++) {
            uint64_t v = ld_acquire_sys(flag);
            if (Exact ? v == e : v >= e) break;
            // The status word is host memory: read it, and the clock,
            // only now and then.
            if (polls % 256 != 0) continue;
            if (failed(status)) {
                go = 0;
                break;
            }
            if (now_ns() - start > timeout_ns) {
                set_status(status, SLIME_AG_TIMEOUT, src);
                go = 0;
                break;
            }
        }
    }
    __syncthreads();
    return go != 0;
}

// The last block to arrive at counter (thread 0 of each block calls it)
// gets true, and resets the counter for the next launch.
__device__ bool last_block(unsigned *counter) {
    __threadfence_system();
    unsigned prev = atomicAdd(counter, 1u);
    if (prev == gridDim.x - 1) {
        *counter = 0;
        __threadfence_system();
        return true;
    }
    return false;
}

__global__ void allgather_ll_kernel(slime_ag_args a) {
    __shared__ uint64_t epoch;
    unsigned *sync = (unsigned *)PTR(a.sync);
    if (threadIdx.x == 0) epoch = *(volatile uint64_t *)PTR(a.epoch) + 1;
    __syncthreads();
    const uint64_t e = epoch;
    const uint64_t slot = e & 1;
    const uint64_t t = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const uint64_t nth = (uint64_t)gridDim.x * blockDim.x;
    const uint64_t n = a.bytes < a.cap ? a.bytes : a.cap;
    const char *src = (const char *)PTR(a.src);

    // 1. push to every peer, the next rank first
    for (int i = 1; i < a.nranks; i++) {
        int p = (a.rank + i) % a.nranks;
        char *d = (char *)PTR(a.scratch[p]) + (slot * a.nranks + a.rank) * a.cap;
        grid_copy<false>(d, src, n, t, nth);
    }
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0 && last_block(&sync[0])) {
        for (int i = 1; i < a.nranks; i++) {
            int p = (a.rank + i) % a.nranks;
            uint64_t *f = (uint64_t *)PTR(a.flags[p]) + (slot * a.nranks + a.rank) * 2;
            *(volatile uint64_t *)(f + 1) = a.total;
            st_release_sys(f, e);
        }
    }
    // 2. own block
    grid_copy<false>((char *)PTR(a.dst) + a.off[a.rank], src, a.expect[a.rank], t, nth);

    // 3. every other block, from this rank's scratch
    const uint64_t *myflags = (const uint64_t *)PTR(a.flags[a.rank]);
    const char *mine = (const char *)PTR(a.scratch[a.rank]);
    for (int i = 1; i < a.nranks; i++) {
        int s = (a.rank - i + a.nranks) % a.nranks;
        const uint64_t *f = myflags + (slot * a.nranks + s) * 2;
        if (!block_wait<true>(f, e, a.status, s, a.timeout_ns)) break;
        if (*(volatile const uint64_t *)(f + 1) != a.totals[s]) {
            if (threadIdx.x == 0) set_status(a.status, SLIME_AG_SIZE, s);
            break;
        }
        uint64_t m = a.expect[s] < a.cap ? a.expect[s] : a.cap;
        grid_copy<true>((char *)PTR(a.dst) + a.off[s], mine + (slot * a.nranks + s) * a.cap, m, t, nth);
    }
    __syncthreads();
    // 4. the last block out advances the epoch
    if (threadIdx.x == 0 && last_block(&sync[1])) *(volatile uint64_t *)PTR(a.epoch) = e;
}

__global__ void barrier_kernel(slime_barrier_args a) {
    __shared__ uint64_t epoch;
    if (threadIdx.x == 0) epoch = *(volatile uint64_t *)PTR(a.epoch) + 1;
    __syncthreads();
    const uint64_t e = epoch;
    for (int p = threadIdx.x; p < a.nranks; p += blockDim.x)
        st_release_sys((uint64_t *)PTR(a.flags[p]) + a.rank, e);
    const uint64_t *mine = (const uint64_t *)PTR(a.flags[a.rank]);
    for (int s = threadIdx.x; s < a.nranks; s += blockDim.x) {
        uint64_t start = now_ns();
        for (unsigned polls = 1; ld_acquire_sys(mine + s) < e; polls++) {
            if (polls % 256 != 0) continue;
            if (failed(a.status)) break;
            if (now_ns() - start > a.timeout_ns) {
                set_status(a.status, SLIME_AG_TIMEOUT, s);
                break;
            }
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) *(volatile uint64_t *)PTR(a.epoch) = e;
}

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
    allgather_ll_kernel<<<blocks, 512, 0, STREAM(stream)>>>(*args);
    CK(cudaGetLastError());
    return SLIME_OK;
}

int slime_barrier(int dev, const slime_barrier_args *args, uint64_t stream) {
    if (args->nranks < 1 || args->nranks > SLIME_MAX_LOCAL || args->rank < 0 || args->rank >= args->nranks)
        return fail(SLIME_ERR_INVALID, "barrier: rank %d of %d (at most %d)", args->rank, args->nranks, SLIME_MAX_LOCAL);
    USE(dev);
    barrier_kernel<<<1, 64, 0, STREAM(stream)>>>(*args);
    CK(cudaGetLastError());
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
    cublasHandle_t h = ((struct blas *)(uintptr_t)handle)->h;
    USE(dev);
    BK(cublasSetStream(h, STREAM(stream)));
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
