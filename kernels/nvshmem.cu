// libslimenvshmem.so: NVSHMEM bootstrap by unique id, the symmetric heap,
// and the put-with-signal all-gather across nodes (slime.h). Built by
// make kernels NVSHMEM_HOME=... where NVSHMEM is installed.
#include "slime.h"
#include "status.h"

#include <cuda_runtime.h>
#include <nvshmem.h>
#include <nvshmemx.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define PTR(p) ((void *)(uintptr_t)(p))
#define CK(call)                                                                              \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            (void)cudaGetLastError(); /* as slime.cu's cuda_fail: not the next launch's */     \
            return fail(SLIME_ERR_CUDA, "%s: %s (%s)", #call, cudaGetErrorString(e_), cudaGetErrorName(e_)); \
        }                                                                                     \
    } while (0)

// The device NVSHMEM was initialized on: its host calls select it first,
// since the calling thread may have another current device (or none).
static int nv_dev = -1;

#define USE_NV()                                                                     \
    do {                                                                             \
        if (nv_dev < 0) return fail(SLIME_ERR_NVSHMEM, "NVSHMEM is not initialized"); \
        CK(cudaSetDevice(nv_dev));                                                   \
    } while (0)

extern "C" {

const char *slime_last_error(void) { return last_error; }

int slime_nvshmem_uid_bytes(void) { return (int)sizeof(nvshmemx_uniqueid_t); }

int slime_nvshmem_get_uid(uint8_t *uid) {
    nvshmemx_uniqueid_t id;
    int rc = nvshmemx_get_uniqueid(&id);
    if (rc != 0) return fail(SLIME_ERR_NVSHMEM, "nvshmemx_get_uniqueid: %d", rc);
    memcpy(uid, &id, sizeof id);
    return SLIME_OK;
}

int slime_nvshmem_init(int dev, const uint8_t *uid, int rank, int nranks) {
    nvshmemx_uniqueid_t id;
    nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
    CK(cudaSetDevice(dev));
    memcpy(&id, uid, sizeof id);
    int rc = nvshmemx_set_attr_uniqueid_args(rank, nranks, &id, &attr);
    if (rc != 0) return fail(SLIME_ERR_NVSHMEM, "nvshmemx_set_attr_uniqueid_args(rank %d of %d): %d", rank, nranks, rc);
    rc = nvshmemx_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID, &attr);
    if (rc != 0) return fail(SLIME_ERR_NVSHMEM, "nvshmemx_init_attr (rank %d of %d): %d", rank, nranks, rc);
    if (nvshmem_my_pe() != rank || nvshmem_n_pes() != nranks)
        return fail(SLIME_ERR_NVSHMEM, "NVSHMEM says PE %d of %d, the job says rank %d of %d",
                    nvshmem_my_pe(), nvshmem_n_pes(), rank, nranks);
    nv_dev = dev;
    return SLIME_OK;
}

int slime_nvshmem_finalize(void) {
    USE_NV();
    nvshmem_finalize();
    nv_dev = -1;
    return SLIME_OK;
}

int slime_nvshmem_malloc(uint64_t bytes, uint64_t *ptr) {
    USE_NV();
    void *p = nvshmem_malloc(bytes ? bytes : 1);
    if (!p) return fail(SLIME_ERR_NVSHMEM, "nvshmem_malloc(%llu): the symmetric heap is full (NVSHMEM_SYMMETRIC_SIZE)", (unsigned long long)bytes);
    *ptr = (uint64_t)(uintptr_t)p;
    return SLIME_OK;
}

int slime_nvshmem_free(uint64_t ptr) {
    USE_NV();
    nvshmem_free(PTR(ptr));
    return SLIME_OK;
}

}  // extern "C"

__device__ __forceinline__ uint64_t now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ void set_status(uint64_t status, int code, int src) {
    volatile int *w = (volatile int *)PTR(status);
    if (*w == 0) *w = code | (src << 8);
    __threadfence_system();
}

__global__ void nvshmem_allgather_kernel(slime_nvshmem_ag_args a) {
    __shared__ uint64_t epoch;
    __shared__ int go;
    unsigned *sync = (unsigned *)PTR(a.sync);
    if (threadIdx.x == 0) {
        epoch = *(volatile uint64_t *)PTR(a.epoch) + 1;
        go = 1;
    }
    __syncthreads();
    const uint64_t e = epoch, slot = e & 1;
    char *stage = (char *)PTR(a.stage) + slot * a.nranks * a.bytes;
    uint64_t *sig = (uint64_t *)PTR(a.sig) + slot * a.nranks;

    // every block puts to its share of the PEs, the next one first
    for (int i = blockIdx.x; i < a.nranks; i += gridDim.x) {
        int pe = (a.rank + i) % a.nranks;
        nvshmemx_putmem_signal_block(stage + (uint64_t)a.rank * a.bytes, PTR(a.src), a.bytes,
                                         sig + a.rank, e, NVSHMEM_SIGNAL_SET, pe);
    }
    // every block waits for every PE, then copies its share of the slot out
    for (int s = threadIdx.x; s < a.nranks; s += blockDim.x) {
        uint64_t start = now_ns();
        bool arrived = true;
        for (unsigned polls = 1; nvshmem_signal_fetch(sig + s) != e; polls++) {
            if (polls % 256 != 0) continue;
            if (*(volatile int *)PTR(a.status) != 0) {
                go = 0;
                arrived = false;
                break;
            }
            if (now_ns() - start > a.timeout_ns) {
                set_status(a.status, SLIME_AG_TIMEOUT, s);
                go = 0;
                arrived = false;
                break;
            }
        }
        // nvshmem_signal_fetch is a plain load: the data that came with the
        // signal is ordered before the reads below only by a wait (which
        // returns at once, the signal being there) and a fence.
        if (arrived) nvshmem_signal_wait_until(sig + s, NVSHMEM_CMP_EQ, e);
    }
    __threadfence();
    __syncthreads();
    if (go) {
        uint64_t n = (uint64_t)a.nranks * a.bytes;
        uint64_t t = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x, nth = (uint64_t)gridDim.x * blockDim.x;
        char *out = (char *)PTR(a.out);
        if ((((uintptr_t)out | (uintptr_t)stage | n) & 15) == 0) {
            for (uint64_t i = t; i < n / 16; i += nth) ((int4 *)out)[i] = __ldcg((const int4 *)stage + i);
        } else {
            for (uint64_t i = t; i < n; i += nth) out[i] = __ldcg(stage + i);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(sync, 1u) == gridDim.x - 1) {
            *sync = 0;
            *(volatile uint64_t *)PTR(a.epoch) = e;
        }
    }
}

extern "C" int slime_nvshmem_allgather(int dev, const slime_nvshmem_ag_args *args, uint64_t stream) {
    if (args->nranks < 1 || args->rank < 0 || args->rank >= args->nranks)
        return fail(SLIME_ERR_INVALID, "nvshmem allgather: rank %d of %d", args->rank, args->nranks);
    CK(cudaSetDevice(dev));
    int blocks = args->nranks < 32 ? args->nranks : 32;
    (void)cudaGetLastError();  // an earlier failed call's, on this thread: not this launch's
    nvshmem_allgather_kernel<<<blocks, 512, 0, (cudaStream_t)(uintptr_t)stream>>>(*args);
    CK(cudaGetLastError());
    return SLIME_OK;
}
