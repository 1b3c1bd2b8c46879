/*
 * slime.h: the whole C ABI between slimego's Go orchestrator and its GPU
 * libraries (libslimecuda.so, and libslimenvshmem.so where NVSHMEM is
 * installed).
 *
 * Rules of the ABI:
 *  - plain C types only; handles are opaque integers (uint64_t);
 *  - every call returns 0 on success or a non-zero slime_status, and
 *    slime_last_error() gives the text of the last failure on the calling
 *    thread;
 *  - every call that touches a device takes the device ordinal first and
 *    selects it itself (the Go caller's goroutine may move between threads);
 *  - no call blocks without a bound: waits are polls (slime_stream_query,
 *    slime_event_query) that the caller repeats until its deadline, and
 *    kernels that wait for peers give up after timeout_ns and say why in a
 *    status word the host reads.
 */
#ifndef SLIME_H
#define SLIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SLIME_ABI_VERSION 3

/* Most ranks of one node that the intra-node kernels take. */
#define SLIME_MAX_LOCAL 64

/* Return codes. */
enum slime_status {
    SLIME_OK = 0,
    SLIME_ERR_CUDA = 1,      /* a CUDA runtime call failed */
    SLIME_ERR_NO_DEVICE = 2, /* no GPU, or no driver */
    SLIME_ERR_INVALID = 3,   /* a bad argument */
    SLIME_ERR_NOT_READY = 4, /* a query: the work is still running */
    SLIME_ERR_BLAS = 5,      /* a cuBLAS call failed */
    SLIME_ERR_NVSHMEM = 6    /* an NVSHMEM call failed */
};

/* Text of the last failure on this thread ("" if none). */
const char *slime_last_error(void);
int slime_abi_version(void);
/* 1 in the emulated library (libslimecuda-emu.so: host threads, no GPU),
 * 0 in the CUDA one: figures measured on the former are no GPU's. */
int slime_emulated(void);

/* Devices. */
int slime_device_count(int *count);
int slime_device_name(int dev, char *buf, int len);
/* PCI bus id ("0000:3b:00.0"), to match a GPU with NVML's view. */
int slime_device_pci_bus_id(int dev, char *buf, int len);
int slime_device_can_access_peer(int dev, int peer, int *ok);
/* Lets kernels on dev touch peer's memory (in-process ranks on different
 * GPUs; memory mapped through IPC needs none). Enabling it again is no
 * error. */
int slime_enable_peer_access(int dev, int peer);
int slime_driver_version(int *version);
int slime_runtime_version(int *version);

/* Memory. Pointers are device addresses as integers. */
int slime_malloc(int dev, uint64_t bytes, uint64_t *ptr);
int slime_free(int dev, uint64_t ptr);
/* Pinned host memory mapped into the device: *host for the CPU, *dptr for
 * kernels. */
int slime_host_alloc(int dev, uint64_t bytes, void **host, uint64_t *dptr);
int slime_host_free(int dev, void *host);
/* Copies with cudaMemcpyDefault (unified addressing): either side may be
 * host or device. The synchronous ones (slime_memcpy, slime_memset) run on
 * the library's own non-blocking stream of dev and return when the bytes
 * are in place, whatever memory either side is: any stream's later work
 * sees them. They order nothing else: work already enqueued on other
 * streams that touches the same memory must be waited for first. */
int slime_memcpy(int dev, uint64_t dst, uint64_t src, uint64_t bytes);
int slime_memcpy_async(int dev, uint64_t dst, uint64_t src, uint64_t bytes, uint64_t stream);
int slime_memset(int dev, uint64_t dst, int value, uint64_t bytes);
int slime_memset_async(int dev, uint64_t dst, int value, uint64_t bytes, uint64_t stream);

/* CUDA IPC: a 64-byte handle that a process on the same node opens (not
 * the process that exported it). Opened again on the same device while
 * open, it returns the same pointer and counts the open: each open takes
 * a slime_ipc_close, the last of which unmaps. */
#define SLIME_IPC_HANDLE_BYTES 64
int slime_ipc_get_handle(int dev, uint64_t ptr, uint8_t handle[SLIME_IPC_HANDLE_BYTES]);
int slime_ipc_open(int dev, const uint8_t handle[SLIME_IPC_HANDLE_BYTES], uint64_t *ptr);
int slime_ipc_close(int dev, uint64_t ptr);
/* The allocation of device memory that holds ptr (one of this process's,
 * or one mapped by slime_ipc_open): its start and its size. An IPC handle
 * maps a whole allocation, so an exporter sends ptr's offset in it, and an
 * importer checks a range against the size of what it mapped. */
int slime_mem_range(int dev, uint64_t ptr, uint64_t *base, uint64_t *size);

/* Streams and events. Queries return SLIME_ERR_NOT_READY while work runs. */
int slime_stream_create(int dev, uint64_t *stream);
int slime_stream_destroy(int dev, uint64_t stream);
int slime_stream_query(int dev, uint64_t stream);
int slime_stream_wait_event(int dev, uint64_t stream, uint64_t event);
int slime_event_create(int dev, int timing, uint64_t *event);
int slime_event_destroy(int dev, uint64_t event);
int slime_event_record(int dev, uint64_t event, uint64_t stream);
int slime_event_query(int dev, uint64_t event);
int slime_event_elapsed_ms(int dev, uint64_t start, uint64_t end, float *ms);

/* CUDA graphs: capture what is launched on a stream (and on the streams
 * that join it through events), instantiate, replay. */
int slime_graph_begin(int dev, uint64_t stream);
/* Ends the capture and instantiates it; *exec is the executable graph. */
int slime_graph_end(int dev, uint64_t stream, uint64_t *exec);
int slime_graph_launch(int dev, uint64_t exec, uint64_t stream);
int slime_graph_destroy(int dev, uint64_t exec);

/*
 * The intra-node low-latency all-gather.
 *
 * Every rank owns a symmetric scratch area that its peers have mapped:
 * 2 slots (by the parity of the call's epoch) x nranks blocks x cap bytes,
 * and a flag area: 2 slots x nranks x {epoch, bytes} (uint64 each). A call
 * with epoch e (the rank's device counter plus one; the kernel advances the
 * counter itself, so that a captured graph replays correctly):
 *  1. pushes the rank's block (min(bytes, cap)) into slot e&1 of every
 *     peer's scratch with 16-byte stores, then raises flag[e&1][rank] =
 *     {e, total} at every peer with a release store;
 *  2. copies its own block into dst (unless it is there already);
 *  3. for every source, waits with acquire loads for flag[e&1][src].epoch
 *     >= e, then copies the block from its own scratch into dst.
 * No flag is ever reset and there is no barrier between calls: a peer can
 * reach slot e&1 again only at epoch e+2, which it cannot start before this
 * rank has pushed (and so finished reading) at epoch e+1, unless the peer
 * has failed: a rank whose status word is set stops waiting for its peers,
 * so its later launches may lap a peer. A flag past e is therefore the
 * size status naming its source (that rank announces poisoned totals, see
 * below), never a wait until the timeout.
 * Blocks larger than cap go in rounds, a launch each (bytes, expect and off
 * of the round; total and totals of the whole blocks, so that a size
 * mismatch shows in the first round). A wait that passes timeout_ns, or a
 * block whose announced total is not the one expected, stops the kernel and writes a code into *status (mapped
 * host memory): see slime_ag_status_*. Once *status is set, the rank's
 * later launches (the rest of the call's rounds, and calls enqueued
 * behind it) still run, but announce their totals with the top bit set,
 * so that a peer reading them stops with the size status rather than
 * take them for blocks of its own call.
 */
typedef struct {
    int32_t rank, nranks;
    uint64_t cap;                         /* bytes of one block in scratch */
    uint64_t src;                         /* this rank's block (of this round) */
    uint64_t bytes;                       /* its size */
    uint64_t total;                       /* the size of the whole block, announced */
    uint64_t dst;                         /* the gathered output */
    uint64_t off[SLIME_MAX_LOCAL];        /* where source s lands in dst */
    uint64_t expect[SLIME_MAX_LOCAL];     /* the bytes expected from s this round */
    uint64_t totals[SLIME_MAX_LOCAL];     /* the whole block expected from s */
    uint64_t scratch[SLIME_MAX_LOCAL];    /* each rank's scratch, mapped here */
    uint64_t flags[SLIME_MAX_LOCAL];      /* each rank's flag area, mapped here */
    uint64_t epoch;                       /* this rank's device counter */
    uint64_t sync;                        /* this rank's 2 x uint32 block counters */
    uint64_t status;                      /* device address of the mapped status word */
    uint64_t timeout_ns;
} slime_ag_args;

/* status word: 0 is success; otherwise code | source << 8 */
#define SLIME_AG_TIMEOUT 1
#define SLIME_AG_SIZE 2

/* Device bytes the counters need (epoch and sync), to be zeroed once. */
#define SLIME_AG_COUNTER_BYTES 64
/* Bytes of a rank's flag area for nranks ranks. */
#define SLIME_AG_FLAG_BYTES(n) ((uint64_t)2 * (uint64_t)(n) * 2 * sizeof(uint64_t))

int slime_allgather_ll(int dev, const slime_ag_args *args, int blocks, uint64_t stream);

/*
 * A flag barrier among the ranks of a node, for schedules that pull from
 * peers' symmetric buffers with the copy engines: each rank raises
 * flag[rank] = epoch at every peer (release) and waits (acquire) until every
 * peer has raised its flag at this rank; the epoch is the rank's counter
 * plus one, advanced by the kernel. Same status codes as the all-gather.
 */
typedef struct {
    int32_t rank, nranks;
    uint64_t flags[SLIME_MAX_LOCAL]; /* each rank's flag array (nranks uint64), mapped here */
    uint64_t epoch;                  /* this rank's device counter */
    uint64_t status;
    uint64_t timeout_ns;
} slime_barrier_args;

int slime_barrier(int dev, const slime_barrier_args *args, uint64_t stream);

/*
 * Loads the library's kernels (the all-gather's and the barrier's) on dev
 * now. Under CUDA's lazy module loading (the default since CUDA 12.2) a
 * kernel is loaded at its first launch, and that load waits for the whole
 * device: a first launch that comes while a peer's kernel on the same
 * device spins waiting for this rank would stall both until the kernel's
 * timeout. Call it before any peer may launch (a GPU group's setup); it
 * may wait for the device's work itself, and is cheap once done.
 */
int slime_preload_kernels(int dev);

/* GEMM with cuBLAS, row-major: C (m x n) = A (m x k) . B (k x n), leading
 * dimensions lda, ldb, ldc in elements. A handle is bound to one device. */
int slime_blas_create(int dev, uint64_t *handle);
int slime_blas_destroy(int dev, uint64_t handle);
int slime_gemm_f32(int dev, uint64_t handle, uint64_t stream, int m, int n, int k,
                   uint64_t a, int lda, uint64_t b, int ldb, uint64_t c, int ldc);
int slime_gemm_f64(int dev, uint64_t handle, uint64_t stream, int m, int n, int k,
                   uint64_t a, int lda, uint64_t b, int ldb, uint64_t c, int ldc);

/*
 * libslimenvshmem.so: NVSHMEM across nodes, where it is installed.
 * Bootstrap: rank 0 makes a unique id (slime_nvshmem_uid_bytes bytes),
 * the Go side passes it to every rank through the rendezvous store, and
 * each rank calls slime_nvshmem_init with it.
 */
int slime_nvshmem_uid_bytes(void);
int slime_nvshmem_get_uid(uint8_t *uid);
int slime_nvshmem_init(int dev, const uint8_t *uid, int rank, int nranks);
int slime_nvshmem_finalize(void);
int slime_nvshmem_malloc(uint64_t bytes, uint64_t *ptr);
int slime_nvshmem_free(uint64_t ptr);

/* Put-with-signal all-gather over the symmetric heap, blocks of equal
 * size. Epoch e (a device counter the kernel advances): every PE puts its
 * block into slot e&1 of every PE's stage (2 slots x nranks x bytes,
 * symmetric) with nvshmemx_putmem_signal_block, raising sig[e&1][rank]
 * there to e; then waits (bounded by timeout_ns) for every sig[e&1][s] == e
 * and copies the slot into out. As with the LL kernel, a PE reaches slot
 * e&1 again only at e+2, after every PE has left epoch e. */
typedef struct {
    int32_t rank, nranks;
    uint64_t src, bytes;   /* this PE's block */
    uint64_t stage;        /* symmetric: 2 x nranks x bytes */
    uint64_t out;          /* the gathered output: nranks x bytes */
    uint64_t sig;          /* symmetric: 2 x nranks uint64 */
    uint64_t epoch, sync;  /* this PE's device counters (SLIME_AG_COUNTER_BYTES) */
    uint64_t status;       /* mapped status word, as for the LL kernel */
    uint64_t timeout_ns;
} slime_nvshmem_ag_args;

int slime_nvshmem_allgather(int dev, const slime_nvshmem_ag_args *args, uint64_t stream);

#ifdef __cplusplus
}
#endif
#endif /* SLIME_H */
