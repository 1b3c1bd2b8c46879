/*
 * libslimecuda-emu.so: the C ABI of slime.h on the host, with no GPU and
 * no CUDA: a test harness that runs every line of slimego's GPU path (the
 * loader, the Go orchestration, the kernels' protocol) in `make test`.
 * No figure measured on it says anything about a GPU; slime_emulated()
 * returns 1 so that callers can say so.
 *
 * The model, and how it is adversarial (never kinder than CUDA's
 * documented guarantees):
 *
 *  - Devices: SLIME_EMU_DEVICES of them (default 1, at most 16), named
 *    "slimego emulated GPU". Every pair can access each other, but a
 *    kernel that touches another device's memory (not mapped through IPC)
 *    before slime_enable_peer_access(dev, peer) fails, as it would fault.
 *  - Memory: device memory is host memory, a memfd per allocation mapped
 *    shared, so that slime_ipc_get_handle/slime_ipc_open map it in other
 *    processes (through /proc/<pid>/fd/<fd>: the exporter must be alive,
 *    as with CUDA). Opening a handle in the process that exported it fails,
 *    as CUDA's does; opening it again where it is open returns the same
 *    pointer and counts the open, as CUDA does, each open taking a close
 *    (a close of a pointer not open fails). cudaMalloc does not zero:
 *    neither does this (the first and last 64 KiB are filled with
 *    garbage). Pinned host memory (slime_host_alloc) is host memory whose
 *    device address is its host address (unified addressing). cudaFree
 *    and cudaFreeHost wait for every stream of the device, as they do on a
 *    GPU (an H200 with CUDA 13 held both until a kernel spinning on
 *    another stream ended, and neither cudaMalloc nor cudaHostAlloc): a
 *    kernel that waits for a peer holds them up. Kernels, memsets and
 *    GEMMs check that every range they touch lies in memory this process
 *    has mapped for their device, and fail the call if not (a GPU would
 *    fault later).
 *  - Lazy loading (CUDA_MODULE_LOADING=LAZY, CUDA's default since 12.2):
 *    a kernel function is loaded on a device the first time the process
 *    launches it there (or captures a launch of it), and that load waits
 *    for every stream of the device, as cudaFree does: an H200 with
 *    CUDA 13 held a first launch until a kernel spinning on another
 *    stream ended (the wait went away with CUDA_MODULE_LOADING=EAGER). So
 *    a rank whose first launch of a kernel comes while a peer's kernel on
 *    the same device spins waiting for this rank stalls both until the
 *    kernel's timeout. The functions: allgather_ll_kernel, barrier_kernel,
 *    and cuBLAS's GEMM, modelled adversarially as one kernel per (element
 *    type, transposes, m, n, k, operand alignments mod 256): cuBLAS picks
 *    its kernel by those, so the Go side warms each GEMM it will run, on
 *    its own operands. slime_preload_kernels(dev) loads slime.cu's two
 *    kernels on dev (what its cudaFuncGetAttributes calls do), waiting as
 *    a first launch does; a GEMM's kernel is loaded by a first GEMM of
 *    that key. CUDA_MODULE_LOADING=EAGER loads everything at init: no
 *    launch waits.
 *  - Streams: a stream is a queue run in order by a worker thread of its
 *    own; every operation waits a random delay (0 to SLIME_EMU_DELAY_US,
 *    default 100 µs, half of the time) before it runs, so that work on
 *    different streams interleaves in any order unless events order it.
 *    Stream 0 is the legacy stream, one per device, ordered with nothing
 *    else (slimego's streams are all non-blocking).
 *  - Copies follow CUDA's API synchronization rules, least kindly:
 *    cudaMemcpy from pageable memory to the device returns once the source
 *    is staged, its DMA landing later on the legacy stream; to pageable
 *    memory it returns when done; between device addresses it returns at
 *    once. cudaMemset on device memory returns at once. cudaMemcpyAsync
 *    from pageable memory stages the source at the call; into pageable
 *    memory it waits for the stream and copies. slime_memcpy and
 *    slime_memset run the same CUDA calls as slime.cu, on this model.
 *  - Events: a record is an operation of the stream; a wait takes the
 *    latest record at the time of the call (none: no wait), as CUDA does.
 *  - Graphs: slime_graph_begin puts a stream in (relaxed) capture: what is
 *    enqueued on it is recorded, not run; events recorded in the capture
 *    carry it to the streams that wait on them (fork) and back (join).
 *    slime_graph_end fails if a forked stream did not join, or if the
 *    capture was invalidated. A replay runs exactly the captured nodes, in
 *    a random order that respects their dependencies. Illegal during
 *    capture, failing as CUDA fails them and invalidating the capture:
 *    querying (or synchronizing) a capturing stream, querying an event
 *    recorded in a capture, a capturing stream waiting on an event from
 *    outside it, a capture of a copy from or to pageable memory, beginning
 *    a capture twice, destroying a capturing stream. In relaxed mode (the
 *    only one slime.cu uses) CUDA allows allocation and copies on other
 *    streams during a capture, and so does this; they are simply not part
 *    of the graph.
 *  - Kernels: the LL all-gather and the barrier run the bodies of
 *    ../protocol.h, the very code nvcc compiles for the GPU; a CUDA block
 *    is a host thread (all of a launch's blocks run at once, each after a
 *    random delay).
 *  - GEMM: cblas (OpenBLAS) where built with SLIME_EMU_CBLAS, else a plain
 *    loop; row-major, as slime.h says.
 *  - SLIME_EMU_SEED seeds every stream's random schedule (a stream's
 *    generator is the seed mixed with its device and creation order), so
 *    that a failing schedule can be replayed; slime_emu_seed() tells the
 *    seed in use. SLIME_EMU_MEMCPY=legacy makes slime_memcpy/slime_memset
 *    the synchronous legacy-stream calls slime.cu once made, to show their
 *    race.
 */
#include "../slime.h"
#include "../protocol.h"
#include "../status.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#ifdef SLIME_EMU_CBLAS
#include <cblas.h>
#endif

namespace {

// ---- CUDA's error names, as slime.cu prints them ---------------------------

struct CudaErr {
    const char *name, *text;
};
const CudaErr eInvalidValue{"cudaErrorInvalidValue", "invalid argument"};
const CudaErr eInvalidDevice{"cudaErrorInvalidDevice", "invalid device ordinal"};
const CudaErr eInvalidHandle{"cudaErrorInvalidResourceHandle", "invalid resource handle"};
const CudaErr eNotReady{"cudaErrorNotReady", "device not ready"};
const CudaErr eIllegalAddress{"cudaErrorIllegalAddress", "an illegal memory access was encountered"};
const CudaErr eMemory{"cudaErrorMemoryAllocation", "out of memory"};
const CudaErr eInvalidContext{"cudaErrorInvalidContext", "invalid device context"};
const CudaErr eMapFailed{"cudaErrorMapBufferObjectFailed", "mapping of buffer object failed"};
const CudaErr eCaptureUnsupported{"cudaErrorStreamCaptureUnsupported", "operation not permitted when stream is capturing"};
const CudaErr eCaptureInvalidated{"cudaErrorStreamCaptureInvalidated", "operation failed due to a previous error during capture"};
const CudaErr eCaptureUnmatched{"cudaErrorStreamCaptureUnmatched", "capture was not initiated in this stream"};
const CudaErr eCaptureUnjoined{"cudaErrorStreamCaptureUnjoined", "capturing stream has unjoined work"};
const CudaErr eCaptureIsolation{"cudaErrorStreamCaptureIsolation", "dependency created on uncaptured work in another stream"};
const CudaErr eIllegalState{"cudaErrorIllegalState", "the operation cannot be performed in the present state"};
const CudaErr eTimingDisabled{"cudaErrorInvalidResourceHandle", "invalid resource handle (an event created without timing)"};

int cfail(const CudaErr &e, const char *what, const char *detail = nullptr) {
    if (detail) return fail(SLIME_ERR_CUDA, "%s: %s (%s): %s", what, e.text, e.name, detail);
    return fail(SLIME_ERR_CUDA, "%s: %s (%s)", what, e.text, e.name);
}

// ---- randomness --------------------------------------------------------------

uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

struct Rng {
    uint64_t s;
    uint64_t next() { return s = mix(s); }
    uint64_t below(uint64_t n) { return n ? next() % n : 0; }
};

uint64_t env_u64(const char *name, uint64_t def) {
    const char *v = getenv(name);
    if (!v || !*v) return def;
    return strtoull(v, nullptr, 0);
}

// ---- global state ------------------------------------------------------------

struct Capture;
struct Stream;

enum Kind { MEM_DEVICE, MEM_HOST, MEM_IPC };

struct Alloc {
    uint64_t base, size;
    Kind kind;
    int dev;
    int fd;       // MEM_DEVICE: the memfd that IPC opens
    uint64_t id;  // MEM_DEVICE: serial; MEM_IPC: the exporter's
    int pid;      // MEM_IPC: the exporter
    int refs;     // MEM_IPC: opens
};

// One node of a stream's work or of a graph.
struct Op {
    std::string what;
    std::function<void(Rng &)> run;
};

struct Node {
    Op op;
    std::vector<int> deps;
};

struct Exec {
    int dev;
    std::vector<Node> nodes;
};

struct Capture {
    Stream *origin;
    std::vector<Node> nodes;
    std::set<Stream *> members;
    bool invalid = false;
    std::string why;
    bool live = true;
};

struct Event {
    int dev;
    bool timing;
    uint64_t recorded = 0, done = 0;  // records issued and completed
    uint64_t t_ns = 0;
    std::shared_ptr<Capture> cap;  // recorded in this capture (while live)
    std::vector<int> capfront;
};

struct Stream {
    int dev;
    bool legacy;
    Rng rng;
    std::deque<Op> q;
    bool busy = false, dying = false;
    std::shared_ptr<Capture> cap;
    std::vector<int> frontier;
    std::condition_variable cv;
};

struct Globals {
    std::mutex mu;
    std::condition_variable done;  // any operation finished
    int ndev;
    uint64_t seed, delay_us;
    bool legacy_memcpy;
    uint64_t serial = 0, alloc_serial = 0;
    std::map<uint64_t, Alloc> allocs;
    std::set<Stream *> streams;  // the handles
    std::set<Stream *> workers;  // every stream whose worker runs, destroyed ones draining included
    std::set<Event *> events;
    std::set<Exec *> execs;
    std::set<uint64_t> blas;
    std::vector<Stream *> legacy;  // per device
    std::vector<Stream *> copier;  // per device: slime_memcpy's own stream
    std::set<std::pair<int, int>> peer;
    bool eager_loading;                           // CUDA_MODULE_LOADING=EAGER
    std::set<std::pair<int, std::string>> loaded;  // (device, kernel function) loaded lazily
};

Globals &G() {
    static Globals *g = [] {
        Globals *g = new Globals;  // never destroyed: workers outlive exit
        g->ndev = (int)std::min<uint64_t>(std::max<uint64_t>(env_u64("SLIME_EMU_DEVICES", 1), 1), 16);
        const char *s = getenv("SLIME_EMU_SEED");
        g->seed = s && *s ? strtoull(s, nullptr, 0) : mix((uint64_t)time(nullptr) ^ ((uint64_t)getpid() << 32));
        g->delay_us = env_u64("SLIME_EMU_DELAY_US", 100);
        const char *m = getenv("SLIME_EMU_MEMCPY");
        g->legacy_memcpy = m && strcmp(m, "legacy") == 0;
        const char *ml = getenv("CUDA_MODULE_LOADING");
        g->eager_loading = ml && strcmp(ml, "EAGER") == 0;
        g->legacy.assign(g->ndev, nullptr);
        g->copier.assign(g->ndev, nullptr);
        return g;
    }();
    return *g;
}

void sleep_us(uint64_t us) {
    if (!us) return;
    struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
    nanosleep(&ts, nullptr);
}

uint64_t random_delay(Rng &r) {
    Globals &g = G();
    if (!g.delay_us || r.below(2) == 0) return 0;
    return r.below(g.delay_us + 1);
}

// ---- streams -------------------------------------------------------------

void worker(Stream *s) {
    Globals &g = G();
    std::unique_lock<std::mutex> lk(g.mu);
    for (;;) {
        s->cv.wait(lk, [&] { return !s->q.empty() || s->dying; });
        if (s->q.empty()) break;  // dying, drained
        Op op = std::move(s->q.front());
        s->q.pop_front();
        s->busy = true;
        uint64_t d = random_delay(s->rng);
        Rng r{s->rng.next()};
        lk.unlock();
        sleep_us(d);
        op.run(r);
        lk.lock();
        s->busy = false;
        g.done.notify_all();
    }
    g.workers.erase(s);
    g.done.notify_all();
    delete s;
}

Stream *new_stream(int dev, bool legacy) {
    Globals &g = G();  // g.mu held
    Stream *s = new Stream;
    s->dev = dev;
    s->legacy = legacy;
    s->rng.s = mix(g.seed ^ ((uint64_t)dev << 48) ^ ++g.serial);
    g.workers.insert(s);
    std::thread(worker, s).detach();
    return s;
}

// stream resolves a handle (0: the device's legacy stream); g.mu held.
Stream *stream_of(int dev, uint64_t h) {
    Globals &g = G();
    if (h == 0) {
        if (!g.legacy[dev]) g.legacy[dev] = new_stream(dev, true);
        return g.legacy[dev];
    }
    Stream *s = (Stream *)(uintptr_t)h;
    if (!g.streams.count(s) || s->dev != dev) return nullptr;
    return s;
}

Stream *copier_of(int dev) {
    Globals &g = G();
    if (!g.copier[dev]) g.copier[dev] = new_stream(dev, false);
    return g.copier[dev];
}

bool idle(Stream *s) { return s->q.empty() && !s->busy; }

void invalidate(const std::shared_ptr<Capture> &c, const std::string &why) {
    if (!c->invalid) {
        c->invalid = true;
        c->why = why;
    }
}

// enqueue adds op to s, or to s's capture; g.mu held.
int enqueue(Stream *s, Op op, const char *what) {
    if (s->cap) {
        if (s->cap->invalid) return cfail(eCaptureInvalidated, what, s->cap->why.c_str());
        s->cap->nodes.push_back(Node{std::move(op), s->frontier});
        s->frontier = {(int)s->cap->nodes.size() - 1};
        return SLIME_OK;
    }
    s->q.push_back(std::move(op));
    s->cv.notify_one();
    return SLIME_OK;
}

// wait_idle blocks until s has run everything enqueued so far; g.mu held.
void wait_idle(std::unique_lock<std::mutex> &lk, Stream *s) {
    G().done.wait(lk, [&] { return idle(s); });
}

// wait_device_idle blocks until every stream of dev has run everything
// enqueued so far (kernels still spinning included); g.mu held: what
// cudaFree and cudaFreeHost wait for on a GPU.
void wait_device_idle(std::unique_lock<std::mutex> &lk, int dev) {
    G().done.wait(lk, [&] {
        for (Stream *s : G().workers)
            if (s->dev == dev && !idle(s)) return false;
        return true;
    });
}

// load_function is lazy loading's load of kernel function fn on dev,
// before its first launch (or capture) there, or when forced
// (slime_preload_kernels): unless loaded already (or everything was, with
// CUDA_MODULE_LOADING=EAGER), it waits for every stream of the device, as
// cudaFree does, then marks fn loaded; g.mu held.
void load_function(std::unique_lock<std::mutex> &lk, int dev, const std::string &fn) {
    Globals &g = G();
    if (g.eager_loading || g.loaded.count({dev, fn})) return;
    wait_device_idle(lk, dev);
    g.loaded.insert({dev, fn});
}

// ---- memory ------------------------------------------------------------------

// find returns the allocation holding [p, p+n); g.mu held.
Alloc *find(uint64_t p, uint64_t n) {
    Globals &g = G();
    auto it = g.allocs.upper_bound(p);
    if (it == g.allocs.begin()) return nullptr;
    --it;
    Alloc &a = it->second;
    if (p < a.base || p + n > a.base + a.size || p + n < p) return nullptr;
    return &a;
}

// reach checks that a kernel on dev may touch [p, p+n); g.mu held.
bool reach(int dev, uint64_t p, uint64_t n, char *why, size_t len) {
    if (n == 0) return true;
    Alloc *a = find(p, n);
    if (!a) {
        snprintf(why, len, "[%#llx, +%llu) is in no allocation this process has mapped", (unsigned long long)p,
                 (unsigned long long)n);
        return false;
    }
    if (a->kind == MEM_DEVICE && a->dev != dev && !G().peer.count({dev, a->dev})) {
        snprintf(why, len, "%#llx is device %d's memory, and peer access from device %d is not enabled",
                 (unsigned long long)p, a->dev, dev);
        return false;
    }
    return true;
}

#define USE(dev)                                                                      \
    do {                                                                              \
        if ((dev) < 0 || (dev) >= G().ndev) return cfail(eInvalidDevice, "cudaSetDevice(dev)"); \
    } while (0)

void poison(char *p, uint64_t n, uint64_t id) {
    Rng r{mix(id ^ G().seed)};
    uint64_t k = std::min<uint64_t>(n, 64 << 10);
    for (uint64_t i = 0; i < k; i++) p[i] = (char)r.next();
    for (uint64_t i = n > k ? n - k : n; i < n; i++) p[i] = (char)r.next();
}

// ---- the CUDA runtime calls slime.cu makes, on the model ---------------------

// pageable says whether p is host memory CUDA does not know (not pinned,
// not device); g.mu held.
bool pageable(uint64_t p, uint64_t n) { return n && !find(p, n); }

// memcpy_async is cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s).
int memcpy_async(std::unique_lock<std::mutex> &lk, int dev, uint64_t dst, uint64_t src, uint64_t n, Stream *s,
                 const char *what) {
    if (n == 0) return SLIME_OK;
    bool from_host = pageable(src, n), to_host = pageable(dst, n);
    if (s->cap && (from_host || to_host)) {
        invalidate(s->cap, "a copy from or to pageable memory was captured");
        return cfail(eCaptureUnsupported, what, "a graph cannot copy from or to pageable host memory");
    }
    if (from_host && to_host) {
        memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
        return SLIME_OK;
    }
    if (to_host) {  // the driver waits for the stream, then copies
        wait_idle(lk, s);
        memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
        return SLIME_OK;
    }
    if (from_host) {  // staged now, landing in stream order
        auto staged = std::make_shared<std::vector<char>>((const char *)(uintptr_t)src, (const char *)(uintptr_t)src + n);
        return enqueue(s, Op{what, [dst, staged](Rng &) { memcpy((void *)(uintptr_t)dst, staged->data(), staged->size()); }},
                       what);
    }
    return enqueue(s, Op{what, [dst, src, n](Rng &) { memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n); }},
                   what);
}

int memset_async(int dev, uint64_t dst, int v, uint64_t n, Stream *s, const char *what) {
    if (n == 0) return SLIME_OK;
    char why[160];
    if (!reach(dev, dst, n, why, sizeof why)) return cfail(eInvalidValue, what, why);
    return enqueue(s, Op{what, [dst, v, n](Rng &) { memset((void *)(uintptr_t)dst, v, n); }}, what);
}

// stream_sync is cudaStreamSynchronize(s).
int stream_sync(std::unique_lock<std::mutex> &lk, Stream *s, const char *what) {
    if (s->cap) {
        invalidate(s->cap, std::string(what) + " during capture");
        return cfail(eCaptureUnsupported, what);
    }
    wait_idle(lk, s);
    return SLIME_OK;
}

// legacy_memcpy is cudaMemcpy(dst, src, n, cudaMemcpyDefault): on the
// legacy stream, returning as CUDA's API synchronization rules allow.
int legacy_memcpy(std::unique_lock<std::mutex> &lk, int dev, uint64_t dst, uint64_t src, uint64_t n) {
    const char *what = "cudaMemcpy(PTR(dst), PTR(src), bytes, cudaMemcpyDefault)";
    if (n == 0) return SLIME_OK;
    Stream *s = stream_of(dev, 0);
    bool from_host = pageable(src, n), to_host = pageable(dst, n);
    Alloc *sa = find(src, n), *da = find(dst, n);
    bool pinned_src = sa && sa->kind == MEM_HOST, pinned_dst = da && da->kind == MEM_HOST;
    if (from_host && to_host) {
        memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
        return SLIME_OK;
    }
    if (from_host) {  // a stream sync, then staged: the DMA lands later
        wait_idle(lk, s);
        return memcpy_async(lk, dev, dst, src, n, s, what);
    }
    int rc = memcpy_async(lk, dev, dst, src, n, s, what);
    if (rc) return rc;
    if (to_host || pinned_dst || pinned_src) wait_idle(lk, s);  // synchronous for the host
    return SLIME_OK;                                              // device to device: returns at once
}

// ---- kernels -------------------------------------------------------------------

// launch runs fn(block) on `blocks` host threads at once, each after a
// random delay.
void launch(Rng &r, int blocks, const std::function<void(const slime_proto::HostBlock &)> &fn, unsigned bdim) {
    std::vector<std::thread> th;
    th.reserve(blocks);
    for (int b = 0; b < blocks; b++) {
        uint64_t d = random_delay(r);
        th.emplace_back([=, &fn] {
            sleep_us(d);
            fn(slime_proto::HostBlock{(unsigned)b, (unsigned)blocks, bdim});
        });
    }
    for (auto &t : th) t.join();
}

void run_graph(const std::shared_ptr<Exec> &x, Rng &r) {
    // a random order that respects the dependencies
    size_t n = x->nodes.size();
    std::vector<int> pending(n);
    std::vector<std::vector<int>> next(n);
    for (size_t i = 0; i < n; i++) {
        pending[i] = (int)x->nodes[i].deps.size();
        for (int d : x->nodes[i].deps) next[d].push_back((int)i);
    }
    std::vector<int> ready;
    for (size_t i = 0; i < n; i++)
        if (!pending[i]) ready.push_back((int)i);
    while (!ready.empty()) {
        size_t k = r.below(ready.size());
        int i = ready[k];
        ready.erase(ready.begin() + k);
        sleep_us(random_delay(r));
        Rng sub{r.next()};
        x->nodes[i].op.run(sub);
        for (int j : next[i])
            if (--pending[j] == 0) ready.push_back(j);
    }
}

// ancestors: every node that reaches one of from (included).
std::set<int> ancestors(const Capture &c, const std::vector<int> &from) {
    std::set<int> seen;
    std::vector<int> st(from.begin(), from.end());
    while (!st.empty()) {
        int i = st.back();
        st.pop_back();
        if (!seen.insert(i).second) continue;
        for (int d : c.nodes[i].deps) st.push_back(d);
    }
    return seen;
}

void end_capture(const std::shared_ptr<Capture> &c) {
    for (Stream *m : c->members) {
        m->cap.reset();
        m->frontier.clear();
    }
    c->live = false;
}

template <typename T>
void gemm_host(int m, int n, int k, const T *a, int lda, const T *b, int ldb, T *c, int ldc);

#ifdef SLIME_EMU_CBLAS
template <>
void gemm_host<float>(int m, int n, int k, const float *a, int lda, const float *b, int ldb, float *c, int ldc) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
}
template <>
void gemm_host<double>(int m, int n, int k, const double *a, int lda, const double *b, int ldb, double *c, int ldc) {
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0, a, lda, b, ldb, 0.0, c, ldc);
}
#else
template <typename T>
void gemm_host(int m, int n, int k, const T *a, int lda, const T *b, int ldb, T *c, int ldc) {
    for (int i = 0; i < m; i++) {
        T *ci = c + (size_t)i * ldc;
        for (int j = 0; j < n; j++) ci[j] = 0;
        for (int p = 0; p < k; p++) {
            const T aip = a[(size_t)i * lda + p];
            const T *bp = b + (size_t)p * ldb;
            for (int j = 0; j < n; j++) ci[j] += aip * bp[j];
        }
    }
}
#endif

template <typename T>
int gemm(int dev, uint64_t handle, uint64_t stream, int m, int n, int k, uint64_t a, int lda, uint64_t b, int ldb,
         uint64_t c, int ldc) {
    USE(dev);
    Globals &g = G();
    std::unique_lock<std::mutex> lk(g.mu);
    if (!g.blas.count(handle)) return fail(SLIME_ERR_BLAS, "gemm: cuBLAS status %d (not a handle of this library)", 1);
    Stream *s = stream_of(dev, stream);
    if (!s) return fail(SLIME_ERR_BLAS, "cublasSetStream(h, STREAM(stream)): cuBLAS status %d (invalid stream)", 7);
    // cuBLAS's checks, for the column-major call that slime.cu makes
    if (m < 0 || n < 0 || k < 0 || lda < std::max(1, k) || ldb < std::max(1, n) || ldc < std::max(1, n))
        return fail(SLIME_ERR_BLAS, "gemm_call(...): cuBLAS status 7 (CUBLAS_STATUS_INVALID_VALUE): m %d n %d k %d lda %d ldb %d ldc %d",
                    m, n, k, lda, ldb, ldc);
    if (m == 0 || n == 0) return SLIME_OK;
    const uint64_t es = sizeof(T);
    // cuBLAS's kernel for this call, loaded lazily. cuBLAS picks its
    // kernel by element type, transposes, shape and the operands'
    // alignment; the emulator, adversarially, treats every (type, N,N, m,
    // n, k, alignments of a, b and c mod 256) as a kernel of its own, so
    // that a GEMM whose exact call was not run before a peer's kernel
    // spins waits for it, as a differently chosen kernel would. The load
    // can release g.mu while it waits for the device, and a cudaFree may
    // unmap an operand meanwhile, so the operands are checked after it,
    // with g.mu held from the checks to the enqueue.
    char fn[128];
    snprintf(fn, sizeof fn, "cublas_gemm_f%d_nn_%dx%dx%d_a%u_b%u_c%u", (int)(8 * es), m, n, k, (unsigned)(a % 256),
             (unsigned)(b % 256), (unsigned)(c % 256));
    load_function(lk, dev, fn);
    if (!g.blas.count(handle) || stream_of(dev, stream) != s) return cfail(eInvalidHandle, "gemm");
    char why[160];
    if ((k && !reach(dev, a, ((uint64_t)(m - 1) * lda + k) * es, why, sizeof why)) ||
        (k && !reach(dev, b, ((uint64_t)(k - 1) * ldb + n) * es, why, sizeof why)) ||
        !reach(dev, c, ((uint64_t)(m - 1) * ldc + n) * es, why, sizeof why))
        return cfail(eIllegalAddress, "gemm", why);
    return enqueue(s, Op{"gemm", [=](Rng &) {
                             gemm_host<T>(m, n, k, (const T *)(uintptr_t)a, lda, (const T *)(uintptr_t)b, ldb,
                                          (T *)(uintptr_t)c, ldc);
                         }},
                   "gemm");
}

}  // namespace

extern "C" {

const char *slime_last_error(void) { return last_error; }
int slime_abi_version(void) { return SLIME_ABI_VERSION; }
int slime_emulated(void) { return 1; }

// Not in slime.h: the emulator's seed, for tests to log.
uint64_t slime_emu_seed(void) { return G().seed; }

int slime_device_count(int *count) {
    *count = G().ndev;
    return SLIME_OK;
}

int slime_device_name(int dev, char *buf, int len) {
    USE(dev);
    snprintf(buf, len, "slimego emulated GPU");
    return SLIME_OK;
}

int slime_device_pci_bus_id(int dev, char *buf, int len) {
    USE(dev);
    snprintf(buf, len, "0000:ee:%02x.0", dev);
    return SLIME_OK;
}

int slime_device_can_access_peer(int dev, int peer, int *ok) {
    *ok = 0;
    USE(dev);
    USE(peer);
    *ok = 1;
    return SLIME_OK;
}

int slime_enable_peer_access(int dev, int peer) {
    USE(dev);
    USE(peer);
    if (dev == peer) return cfail(eInvalidDevice, "cudaDeviceEnablePeerAccess(peer, 0)", "a device is not its own peer");
    std::lock_guard<std::mutex> lk(G().mu);
    G().peer.insert({dev, peer});  // again: already enabled, which is success
    return SLIME_OK;
}

int slime_driver_version(int *version) {
    *version = 12040;
    return SLIME_OK;
}

int slime_runtime_version(int *version) {
    *version = 12040;
    return SLIME_OK;
}

int slime_malloc(int dev, uint64_t bytes, uint64_t *ptr) {
    USE(dev);
    Globals &g = G();
    uint64_t size = bytes ? bytes : 1;
    int fd = memfd_create("slimego-emu", MFD_CLOEXEC);
    if (fd < 0) return cfail(eMemory, "cudaMalloc(&p, bytes ? bytes : 1)", strerror(errno));
    if (ftruncate(fd, (off_t)size) != 0) {
        int e = errno;
        close(fd);
        return cfail(eMemory, "cudaMalloc(&p, bytes ? bytes : 1)", strerror(e));
    }
    void *p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        close(fd);
        return cfail(eMemory, "cudaMalloc(&p, bytes ? bytes : 1)", strerror(e));
    }
    std::lock_guard<std::mutex> lk(g.mu);
    uint64_t id = ++g.alloc_serial;
    poison((char *)p, size, id);
    g.allocs[(uint64_t)(uintptr_t)p] = Alloc{(uint64_t)(uintptr_t)p, size, MEM_DEVICE, dev, fd, id, getpid(), 0};
    *ptr = (uint64_t)(uintptr_t)p;
    return SLIME_OK;
}

int slime_free(int dev, uint64_t ptr) {
    USE(dev);
    Globals &g = G();
    std::unique_lock<std::mutex> lk(g.mu);
    auto it = g.allocs.find(ptr);
    if (it == g.allocs.end() || it->second.kind != MEM_DEVICE) return cfail(eInvalidValue, "cudaFree(PTR(ptr))");
    // cudaFree waits for the device's work (which may still touch it),
    // letting go of the lock meanwhile: another free of the same pointer
    // may have taken it by then, so look it up again.
    wait_device_idle(lk, it->second.dev);
    it = g.allocs.find(ptr);
    if (it == g.allocs.end() || it->second.kind != MEM_DEVICE) return cfail(eInvalidValue, "cudaFree(PTR(ptr))");
    munmap((void *)(uintptr_t)ptr, it->second.size);
    close(it->second.fd);
    g.allocs.erase(it);
    return SLIME_OK;
}

int slime_host_alloc(int dev, uint64_t bytes, void **host, uint64_t *dptr) {
    USE(dev);
    uint64_t size = bytes ? bytes : 1;
    void *p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return cfail(eMemory, "cudaHostAlloc", strerror(errno));
    std::lock_guard<std::mutex> lk(G().mu);
    G().allocs[(uint64_t)(uintptr_t)p] = Alloc{(uint64_t)(uintptr_t)p, size, MEM_HOST, dev, -1, 0, getpid(), 0};
    *host = p;
    *dptr = (uint64_t)(uintptr_t)p;
    return SLIME_OK;
}

int slime_host_free(int dev, void *host) {
    USE(dev);
    std::unique_lock<std::mutex> lk(G().mu);
    auto it = G().allocs.find((uint64_t)(uintptr_t)host);
    if (it == G().allocs.end() || it->second.kind != MEM_HOST) return cfail(eInvalidValue, "cudaFreeHost(host)");
    // cudaFreeHost waits for the device's work, as cudaFree does: a kernel
    // that spins (waiting for a peer) holds it up until it ends.
    wait_device_idle(lk, dev);
    it = G().allocs.find((uint64_t)(uintptr_t)host);
    if (it == G().allocs.end() || it->second.kind != MEM_HOST) return cfail(eInvalidValue, "cudaFreeHost(host)");
    munmap(host, it->second.size);
    G().allocs.erase(it);
    return SLIME_OK;
}

// slime_memcpy: on the library's own non-blocking stream, then that
// stream synchronized: the bytes are at dst on return, whatever memory
// either side is (a legacy cudaMemcpy from pageable memory returns once the
// source is staged, and orders only the legacy stream).
int slime_memcpy(int dev, uint64_t dst, uint64_t src, uint64_t bytes) {
    USE(dev);
    Globals &g = G();
    std::unique_lock<std::mutex> lk(g.mu);
    if (g.legacy_memcpy) return legacy_memcpy(lk, dev, dst, src, bytes);
    Stream *s = copier_of(dev);
    int rc = memcpy_async(lk, dev, dst, src, bytes, s,
                          "cudaMemcpyAsync(PTR(dst), PTR(src), bytes, cudaMemcpyDefault, copier)");
    if (rc) return rc;
    return stream_sync(lk, s, "cudaStreamSynchronize(copier)");
}

int slime_memcpy_async(int dev, uint64_t dst, uint64_t src, uint64_t bytes, uint64_t stream) {
    USE(dev);
    std::unique_lock<std::mutex> lk(G().mu);
    Stream *s = stream_of(dev, stream);
    if (!s) return cfail(eInvalidHandle, "cudaMemcpyAsync(PTR(dst), PTR(src), bytes, cudaMemcpyDefault, STREAM(stream))");
    return memcpy_async(lk, dev, dst, src, bytes, s,
                        "cudaMemcpyAsync(PTR(dst), PTR(src), bytes, cudaMemcpyDefault, STREAM(stream))");
}

int slime_memset(int dev, uint64_t dst, int value, uint64_t bytes) {
    USE(dev);
    Globals &g = G();
    std::unique_lock<std::mutex> lk(g.mu);
    if (g.legacy_memcpy) {  // cudaMemset: asynchronous for the host, on the legacy stream
        Alloc *a = find(dst, bytes);
        int rc = memset_async(dev, dst, value, bytes, stream_of(dev, 0), "cudaMemset(PTR(dst), value, bytes)");
        if (rc == SLIME_OK && a && a->kind == MEM_HOST) wait_idle(lk, stream_of(dev, 0));
        return rc;
    }
    Stream *s = copier_of(dev);
    int rc = memset_async(dev, dst, value, bytes, s, "cudaMemsetAsync(PTR(dst), value, bytes, copier)");
    if (rc) return rc;
    return stream_sync(lk, s, "cudaStreamSynchronize(copier)");
}

int slime_memset_async(int dev, uint64_t dst, int value, uint64_t bytes, uint64_t stream) {
    USE(dev);
    std::unique_lock<std::mutex> lk(G().mu);
    Stream *s = stream_of(dev, stream);
    if (!s) return cfail(eInvalidHandle, "cudaMemsetAsync(PTR(dst), value, bytes, STREAM(stream))");
    return memset_async(dev, dst, value, bytes, s, "cudaMemsetAsync(PTR(dst), value, bytes, STREAM(stream))");
}

// The handle: "SLIMEEMU", the exporter's pid and memfd, the allocation's
// size and serial.
struct IpcHandle {
    char magic[8];
    int32_t pid, fd;
    uint64_t size, id, base;
};
static_assert(sizeof(IpcHandle) <= SLIME_IPC_HANDLE_BYTES, "IPC handle too large");

int slime_ipc_get_handle(int dev, uint64_t ptr, uint8_t handle[SLIME_IPC_HANDLE_BYTES]) {
    USE(dev);
    std::lock_guard<std::mutex> lk(G().mu);
    Alloc *a = find(ptr, 1);
    if (!a || a->kind != MEM_DEVICE) return cfail(eInvalidValue, "cudaIpcGetMemHandle(&h, PTR(ptr))", "not device memory of this process");
    IpcHandle h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, "SLIMEEMU", 8);
    h.pid = getpid();
    h.fd = a->fd;
    h.size = a->size;
    h.id = a->id;
    h.base = a->base;
    memset(handle, 0, SLIME_IPC_HANDLE_BYTES);
    memcpy(handle, &h, sizeof h);
    return SLIME_OK;
}

int slime_ipc_open(int dev, const uint8_t handle[SLIME_IPC_HANDLE_BYTES], uint64_t *ptr) {
    const char *what = "cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess)";
    USE(dev);
    IpcHandle h;
    memcpy(&h, handle, sizeof h);
    if (memcmp(h.magic, "SLIMEEMU", 8) != 0) return cfail(eInvalidValue, what, "not a handle of the emulator");
    if (h.pid == getpid()) return cfail(eInvalidContext, what, "a handle cannot be opened in the process that exported it");
    Globals &g = G();
    // As CUDA: a handle opened already in this context (device and
    // process) returns the same pointer and counts the open; each open
    // takes a close (slime_ipc_close unmaps at the last).
    auto reopen = [&]() -> Alloc * {
        for (auto &kv : g.allocs)
            if (kv.second.kind == MEM_IPC && kv.second.pid == h.pid && kv.second.id == h.id && kv.second.dev == dev)
                return &kv.second;
        return nullptr;
    };
    {
        std::lock_guard<std::mutex> lk(g.mu);
        if (Alloc *a = reopen()) {
            a->refs++;
            *ptr = a->base;
            return SLIME_OK;
        }
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", h.pid, h.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return cfail(eMapFailed, what, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != h.size) {
        close(fd);
        return cfail(eMapFailed, what, "the exporter's allocation is gone");
    }
    void *p = mmap(nullptr, h.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return cfail(eMapFailed, what, strerror(errno));
    std::lock_guard<std::mutex> lk(g.mu);
    if (Alloc *a = reopen()) {  // another thread opened it meanwhile
        munmap(p, h.size);
        a->refs++;
        *ptr = a->base;
        return SLIME_OK;
    }
    g.allocs[(uint64_t)(uintptr_t)p] = Alloc{(uint64_t)(uintptr_t)p, h.size, MEM_IPC, dev, -1, h.id, h.pid, 1};
    *ptr = (uint64_t)(uintptr_t)p;
    return SLIME_OK;
}

int slime_ipc_close(int dev, uint64_t ptr) {
    USE(dev);
    Globals &g = G();
    std::unique_lock<std::mutex> lk(g.mu);
    auto it = g.allocs.find(ptr);
    // Not a pointer slime_ipc_open returned, or closed as often as opened.
    if (it == g.allocs.end() || it->second.kind != MEM_IPC)
        return cfail(eInvalidValue, "cudaIpcCloseMemHandle(PTR(ptr))", "not a mapping open in this process");
    if (--it->second.refs > 0) return SLIME_OK;
    munmap((void *)(uintptr_t)ptr, it->second.size);
    g.allocs.erase(it);
    return SLIME_OK;
}

int slime_mem_range(int dev, uint64_t ptr, uint64_t *base, uint64_t *size) {
    USE(dev);
    std::lock_guard<std::mutex> lk(G().mu);
    Alloc *a = find(ptr, 1);
    if (!a || a->kind == MEM_HOST) return cfail(eInvalidValue, "cuMemGetAddressRange(&base, &size, ptr)", "not device memory this process has mapped");
    *base = a->base;
    *size = a->size;
    return SLIME_OK;
}

int slime_stream_create(int dev, uint64_t *stream) {
    USE(dev);
    std::lock_guard<std::mutex> lk(G().mu);
    Stream *s = new_stream(dev, false);
    G().streams.insert(s);
    *stream = (uint64_t)(uintptr_t)s;
    return SLIME_OK;
}

int slime_stream_destroy(int dev, uint64_t stream) {
    USE(dev);
    std::lock_guard<std::mutex> lk(G().mu);
    Stream *s = stream ? stream_of(dev, stream) : nullptr;
    if (!s) return cfail(eInvalidHandle, "cudaStreamDestroy(STREAM(stream))");
    if (s->cap) {
        invalidate(s->cap, "a capturing stream was destroyed");
        return cfail(eCaptureUnsupported, "cudaStreamDestroy(STREAM(stream))");
    }
    // As CUDA: returns at once; the stream's work finishes, then it goes.
    G().streams.erase(s);
    s->dying = true;
    s->cv.notify_one();
    return SLIME_OK;
}

int slime_stream_query(int dev, uint64_t stream) {
    USE(dev);
    std::lock_guard<std::mutex> lk(G().mu);
    Stream *s = stream_of(dev, stream);
    if (!s) return cfail(eInvalidHandle, "cudaStreamQuery");
    if (s->cap) {
        invalidate(s->cap, "the capturing stream was queried");
        return cfail(eCaptureUnsupported, "cudaStreamQuery");
    }
    return idle(s) ? SLIME_OK : SLIME_ERR_NOT_READY;
}

int slime_stream_wait_event(int dev, uint64_t stream, uint64_t event) {
    const char *what = "cudaStreamWaitEvent(STREAM(stream), EVENT(event), 0)";
    USE(dev);
    Globals &g = G();
    std::lock_guard<std::mutex> lk(g.mu);
    Stream *s = stream_of(dev, stream);
    Event *e = (Event *)(uintptr_t)event;
    if (!s || !g.events.count(e)) return cfail(eInvalidHandle, what);
    if (e->cap && e->cap->live) {
        if (!s->cap) {  // fork: s joins the capture
            s->cap = e->cap;
            s->frontier = e->capfront;
            e->cap->members.insert(s);
        } else if (s->cap == e->cap) {
            for (int i : e->capfront)
                if (std::find(s->frontier.begin(), s->frontier.end(), i) == s->frontier.end()) s->frontier.push_back(i);
        } else {
            invalidate(s->cap, "a wait on another capture's event");
            invalidate(e->cap, "a wait on another capture's event");
            return cfail(eCaptureIsolation, what);
        }
        return SLIME_OK;
    }
    if (s->cap) {
        if (e->recorded == 0) return SLIME_OK;
        invalidate(s->cap, "the capturing stream waited on an event recorded outside the capture");
        return cfail(eCaptureIsolation, what);
    }
    uint64_t target = e->recorded;
    if (target == 0) return SLIME_OK;
    return enqueue(s, Op{what, [e, target](Rng &) {
                             Globals &g = G();
                             std::unique_lock<std::mutex> lk(g.mu);
                             g.done.wait(lk, [&] { return e->done >= target; });
                         }},
                   what);
}

int slime_event_create(int dev, int timing, uint64_t *event) {
    USE(dev);
    Event *e = new Event;
    e->dev = dev;
    e->timing = timing != 0;
    std::lock_guard<std::mutex> lk(G().mu);
    G().events.insert(e);
    *event = (uint64_t)(uintptr_t)e;
    return SLIME_OK;
}

int slime_event_destroy(int dev, uint64_t event) {
    USE(dev);
    std::lock_guard<std::mutex> lk(G().mu);
    Event *e = (Event *)(uintptr_t)event;
    if (!G().events.erase(e)) return cfail(eInvalidHandle, "cudaEventDestroy(EVENT(event))");
    // As CUDA: pending work that records or waits on it still completes; the
    // emulator keeps the (small) object.
    return SLIME_OK;
}

int slime_event_record(int dev, uint64_t event, uint64_t stream) {
    const char *what = "cudaEventRecord(EVENT(event), STREAM(stream))";
    USE(dev);
    Globals &g = G();
    std::lock_guard<std::mutex> lk(g.mu);
    Stream *s = stream_of(dev, stream);
    Event *e = (Event *)(uintptr_t)event;
    if (!s || !g.events.count(e)) return cfail(eInvalidHandle, what);
    if (s->cap) {
        if (s->cap->invalid) return cfail(eCaptureInvalidated, what, s->cap->why.c_str());
        e->cap = s->cap;
        e->capfront = s->frontier;
        return SLIME_OK;
    }
    e->cap.reset();
    uint64_t id = ++e->recorded;
    return enqueue(s, Op{what, [e, id](Rng &) {
                             uint64_t t = slime_proto::now_ns();
                             std::lock_guard<std::mutex> lk(G().mu);
                             if (e->done < id) {
                                 e->done = id;
                                 e->t_ns = t;
                             }
                         }},
                   what);
}

int slime_event_query(int dev, uint64_t event) {
    USE(dev);
    std::lock_guard<std::mutex> lk(G().mu);
    Event *e = (Event *)(uintptr_t)event;
    if (!G().events.count(e)) return cfail(eInvalidHandle, "cudaEventQuery");
    if (e->cap && e->cap->live) {
        invalidate(e->cap, "an event of the capture was queried");
        return cfail(eCaptureUnsupported, "cudaEventQuery");
    }
    return e->done >= e->recorded ? SLIME_OK : SLIME_ERR_NOT_READY;
}

int slime_event_elapsed_ms(int dev, uint64_t start, uint64_t end, float *ms) {
    const char *what = "cudaEventElapsedTime(ms, EVENT(start), EVENT(end))";
    USE(dev);
    std::lock_guard<std::mutex> lk(G().mu);
    Event *a = (Event *)(uintptr_t)start, *b = (Event *)(uintptr_t)end;
    if (!G().events.count(a) || !G().events.count(b)) return cfail(eInvalidHandle, what);
    if (!a->timing || !b->timing) return cfail(eTimingDisabled, what);
    if ((a->cap && a->cap->live) || (b->cap && b->cap->live)) return cfail(eCaptureUnsupported, what);
    if (!a->recorded || !b->recorded) return cfail(eInvalidHandle, what, "an event was never recorded");
    if (a->done < a->recorded || b->done < b->recorded) return cfail(eNotReady, what);
    *ms = (float)((double)((int64_t)(b->t_ns - a->t_ns)) / 1e6);
    return SLIME_OK;
}

int slime_graph_begin(int dev, uint64_t stream) {
    const char *what = "cudaStreamBeginCapture(STREAM(stream), cudaStreamCaptureModeRelaxed)";
    USE(dev);
    std::lock_guard<std::mutex> lk(G().mu);
    Stream *s = stream_of(dev, stream);
    if (!s) return cfail(eInvalidHandle, what);
    if (s->legacy) return cfail(eCaptureUnsupported, what, "the legacy stream cannot be captured");
    if (s->cap) {
        invalidate(s->cap, "a second capture began on a capturing stream");
        return cfail(eIllegalState, what, "the stream is capturing already");
    }
    s->cap = std::make_shared<Capture>();
    s->cap->origin = s;
    s->cap->members.insert(s);
    s->frontier.clear();
    return SLIME_OK;
}

int slime_graph_end(int dev, uint64_t stream, uint64_t *exec) {
    const char *what = "cudaStreamEndCapture(STREAM(stream), &g)";
    USE(dev);
    std::lock_guard<std::mutex> lk(G().mu);
    *exec = 0;
    Stream *s = stream_of(dev, stream);
    if (!s) return cfail(eInvalidHandle, what);
    if (!s->cap) return cfail(eIllegalState, what, "the stream is not capturing");
    std::shared_ptr<Capture> c = s->cap;
    if (c->origin != s) {
        invalidate(c, "the capture was ended on a stream that joined it");
        return cfail(eCaptureUnmatched, what);
    }
    if (!c->invalid) {
        std::set<int> joined = ancestors(*c, s->frontier);
        for (Stream *m : c->members)
            for (int i : m->frontier)
                if (!joined.count(i)) invalidate(c, "a stream forked into the capture did not join it again");
        if (c->invalid) {
            end_capture(c);
            return cfail(eCaptureUnjoined, what);
        }
    }
    end_capture(c);
    if (c->invalid) return cfail(eCaptureInvalidated, what, c->why.c_str());
    Exec *x = new Exec{dev, std::move(c->nodes)};
    G().execs.insert(x);
    *exec = (uint64_t)(uintptr_t)x;
    return SLIME_OK;
}

int slime_graph_launch(int dev, uint64_t exec, uint64_t stream) {
    const char *what = "cudaGraphLaunch((cudaGraphExec_t)(uintptr_t)exec, STREAM(stream))";
    USE(dev);
    std::lock_guard<std::mutex> lk(G().mu);
    Stream *s = stream_of(dev, stream);
    Exec *x = (Exec *)(uintptr_t)exec;
    if (!s || !G().execs.count(x)) return cfail(eInvalidHandle, what);
    // a snapshot: destroying the exec later does not touch a launch
    auto snap = std::make_shared<Exec>(*x);
    return enqueue(s, Op{what, [snap](Rng &r) { run_graph(snap, r); }}, what);
}

int slime_graph_destroy(int dev, uint64_t exec) {
    USE(dev);
    std::lock_guard<std::mutex> lk(G().mu);
    Exec *x = (Exec *)(uintptr_t)exec;
    if (!G().execs.erase(x)) return cfail(eInvalidHandle, "cudaGraphExecDestroy((cudaGraphExec_t)(uintptr_t)exec)");
    delete x;
    return SLIME_OK;
}

int slime_allgather_ll(int dev, const slime_ag_args *args, int blocks, uint64_t stream) {
    if (args->nranks < 1 || args->nranks > SLIME_MAX_LOCAL || args->rank < 0 || args->rank >= args->nranks)
        return fail(SLIME_ERR_INVALID, "allgather: rank %d of %d (at most %d)", args->rank, args->nranks, SLIME_MAX_LOCAL);
    if (args->expect[args->rank] != args->bytes || args->bytes > args->cap)
        return fail(SLIME_ERR_INVALID, "allgather: own block of %llu bytes, layout says %llu, scratch holds %llu",
                    (unsigned long long)args->bytes, (unsigned long long)args->expect[args->rank],
                    (unsigned long long)args->cap);
    if (blocks < 1) blocks = 1;
    USE(dev);
    const char *what = "allgather_ll_kernel<<<blocks, 512, 0, STREAM(stream)>>>";
    std::unique_lock<std::mutex> lk(G().mu);
    Stream *s = stream_of(dev, stream);
    if (!s) return cfail(eInvalidHandle, what);
    // Loaded (lazily) before the operands are checked: the load can release
    // G().mu while it waits for the device, and a cudaFree may unmap an
    // operand meanwhile; from the checks to the enqueue G().mu stays held.
    load_function(lk, dev, "allgather_ll_kernel");
    if (stream_of(dev, stream) != s) return cfail(eInvalidHandle, what);
    const slime_ag_args a = *args;
    const int n = a.nranks;
    char why[200];
    bool ok = reach(dev, a.src, a.bytes, why, sizeof why) && reach(dev, a.epoch, 8, why, sizeof why) &&
              reach(dev, a.sync, 8, why, sizeof why) && reach(dev, a.status, 4, why, sizeof why);
    for (int p = 0; ok && p < n; p++) {
        uint64_t m = a.expect[p] < a.cap ? a.expect[p] : a.cap;
        ok = reach(dev, a.scratch[p], 2 * (uint64_t)n * a.cap, why, sizeof why) &&
             reach(dev, a.flags[p], SLIME_AG_FLAG_BYTES(n), why, sizeof why) &&
             (p == a.rank ? reach(dev, a.dst + a.off[p], a.expect[p], why, sizeof why)
                          : reach(dev, a.dst + a.off[p], m, why, sizeof why));
    }
    if (!ok) return cfail(eIllegalAddress, what, why);
    return enqueue(s, Op{what, [a, blocks](Rng &r) {
                             launch(r, blocks, [&a](const slime_proto::HostBlock &b) { slime_proto::allgather_ll(b, a); }, 512);
                         }},
                   what);
}

int slime_barrier(int dev, const slime_barrier_args *args, uint64_t stream) {
    if (args->nranks < 1 || args->nranks > SLIME_MAX_LOCAL || args->rank < 0 || args->rank >= args->nranks)
        return fail(SLIME_ERR_INVALID, "barrier: rank %d of %d (at most %d)", args->rank, args->nranks, SLIME_MAX_LOCAL);
    USE(dev);
    const char *what = "barrier_kernel<<<1, 64, 0, STREAM(stream)>>>";
    std::unique_lock<std::mutex> lk(G().mu);
    Stream *s = stream_of(dev, stream);
    if (!s) return cfail(eInvalidHandle, what);
    // Loaded before the operands are checked, as in slime_allgather_ll.
    load_function(lk, dev, "barrier_kernel");
    if (stream_of(dev, stream) != s) return cfail(eInvalidHandle, what);
    const slime_barrier_args a = *args;
    char why[200];
    bool ok = reach(dev, a.epoch, 8, why, sizeof why) && reach(dev, a.status, 4, why, sizeof why);
    for (int p = 0; ok && p < a.nranks; p++) ok = reach(dev, a.flags[p], 8 * (uint64_t)a.nranks, why, sizeof why);
    if (!ok) return cfail(eIllegalAddress, what, why);
    return enqueue(s, Op{what, [a](Rng &r) {
                             launch(r, 1, [&a](const slime_proto::HostBlock &b) { slime_proto::barrier(b, a); }, 64);
                         }},
                   what);
}

int slime_preload_kernels(int dev) {
    USE(dev);
    std::unique_lock<std::mutex> lk(G().mu);
    load_function(lk, dev, "allgather_ll_kernel");
    load_function(lk, dev, "barrier_kernel");
    return SLIME_OK;
}

int slime_blas_create(int dev, uint64_t *handle) {
    USE(dev);
    std::lock_guard<std::mutex> lk(G().mu);
    uint64_t h = (uint64_t)(uintptr_t)new int(dev);
    G().blas.insert(h);
    *handle = h;
    return SLIME_OK;
}

int slime_blas_destroy(int dev, uint64_t handle) {
    USE(dev);
    std::lock_guard<std::mutex> lk(G().mu);
    if (!G().blas.erase(handle)) return fail(SLIME_ERR_BLAS, "cublasDestroy(b->h): cuBLAS status 1 (not initialized)");
    delete (int *)(uintptr_t)handle;
    return SLIME_OK;
}

int slime_gemm_f32(int dev, uint64_t handle, uint64_t stream, int m, int n, int k, uint64_t a, int lda, uint64_t b,
                   int ldb, uint64_t c, int ldc) {
    return gemm<float>(dev, handle, stream, m, n, k, a, lda, b, ldb, c, ldc);
}

int slime_gemm_f64(int dev, uint64_t handle, uint64_t stream, int m, int n, int k, uint64_t a, int lda, uint64_t b,
                   int ldb, uint64_t c, int ldc) {
    return gemm<double>(dev, handle, stream, m, n, k, a, lda, b, ldb, c, ldc);
}

}  // extern "C"
