/*
 * protocol.h: the bodies of the intra-node kernels (the LL all-gather and
 * the flag barrier: pushes, epoch flags, parity slots, bounded waits, the
 * status word), written once and compiled twice:
 *
 *  - by nvcc into slime.cu's __global__ kernels, where a block is a CUDA
 *    block of blockDim.x threads;
 *  - by g++ (C++20) into the emulator (emu/slime_emu.cc), where a block is
 *    one host thread that plays all of its block's threads.
 *
 * The code is written against a block context X (DevBlock below, or the
 * emulator's HostBlock) so that both readings are exact:
 *  - x.leader() is "threadIdx.x == 0": on the host the one thread is every
 *    thread of the block, so it is the leader too;
 *  - x.sync() is __syncthreads(): on the host a no-op, the block's one
 *    thread having finished every "thread's" part before the next line;
 *  - x.each(n, f) runs f(i) for the i of 0..n-1 that this thread owns when
 *    the block's threads stride over n (i = threadIdx.x, += blockDim.x); on
 *    the host, every i;
 *  - x.grid(n, f) runs f(lo, hi) over the elements of 0..n-1 that this
 *    thread owns when the whole grid strides over n (i = global thread id,
 *    += all threads): on the device one element at a time, on the host the
 *    block's contiguous runs of blockDim elements. The same elements go to
 *    the same block either way; only the order within a block differs,
 *    which CUDA leaves unspecified.
 * SLIME_SHARED marks __shared__ variables: on the host, locals of the
 * block's thread.
 *
 * Memory order: device side, the PTX release/acquire at system scope and
 * __threadfence_system the kernels always used; host side, std::atomic_ref
 * with release/acquire and seq_cst fences, which give the same
 * happens-before edges (memory shared between processes included: the
 * atomics are lock-free).
 */
#ifndef SLIME_PROTOCOL_H
#define SLIME_PROTOCOL_H

#include "slime.h"

#include <stdint.h>

#if defined(__CUDACC__)
#define SLIME_DEV __device__ __forceinline__
#define SLIME_SHARED __shared__
#else
#include <atomic>
#include <string.h>
#include <time.h>
#include <sched.h>
#define SLIME_DEV inline
#define SLIME_SHARED
#endif

#define SLIME_P(p) ((void *)(uintptr_t)(p))

namespace slime_proto {

#if defined(__CUDACC__)

SLIME_DEV void st_release_sys(uint64_t *p, uint64_t v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

SLIME_DEV uint64_t ld_acquire_sys(const uint64_t *p) {
    uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

SLIME_DEV uint64_t ld_u64(const uint64_t *p) { return *(volatile const uint64_t *)p; }
SLIME_DEV void st_u64(uint64_t *p, uint64_t v) { *(volatile uint64_t *)p = v; }
SLIME_DEV int ld_i32(const int *p) { return *(volatile const int *)p; }
SLIME_DEV void st_i32(int *p, int v) { *(volatile int *)p = v; }
SLIME_DEV void st_u32(unsigned *p, unsigned v) { *(volatile unsigned *)p = v; }
SLIME_DEV unsigned add_u32(unsigned *p, unsigned v) { return atomicAdd(p, v); }
SLIME_DEV void fence_system() { __threadfence_system(); }
SLIME_DEV void poll_pause(unsigned) {}

SLIME_DEV uint64_t now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// copy elements lo..hi-1 (one, on the device); Fresh data (written by other
// GPUs or ranks during this kernel) is loaded around L1, which is not
// coherent.
template <bool Fresh, typename T>
SLIME_DEV void copy_elems(T *d, const T *s, uint64_t lo, uint64_t hi) {
    for (uint64_t i = lo; i < hi; i++) d[i] = Fresh ? __ldcg(s + i) : s[i];
}
typedef int4 vec16;

// A CUDA block.
struct DevBlock {
    SLIME_DEV bool leader() const { return threadIdx.x == 0; }
    SLIME_DEV void sync() const { __syncthreads(); }
    SLIME_DEV unsigned blocks() const { return gridDim.x; }
    template <typename F>
    SLIME_DEV void each(int n, F f) const {
        for (int i = threadIdx.x; i < n; i += blockDim.x) f(i);
    }
    template <typename F>
    SLIME_DEV void grid(uint64_t n, F f) const {
        const uint64_t t = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
        const uint64_t nth = (uint64_t)gridDim.x * blockDim.x;
        for (uint64_t i = t; i < n; i += nth) f(i, i + 1);
    }
};

// copy_vecs copies n 16-byte elements, each thread the elements that
// DevBlock::grid gives it (t, t + nth, ...), copyUnroll of them at a
// time: their loads are all issued before the first store, so that a
// thread keeps that many loads in flight rather than one (a copy's speed
// is the bytes in flight over the memory's latency).
constexpr int copyUnroll = 4;
template <bool Fresh>
SLIME_DEV void copy_vecs(const DevBlock &, vec16 *d, const vec16 *s, uint64_t n) {
    const uint64_t t = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const uint64_t nth = (uint64_t)gridDim.x * blockDim.x;
    uint64_t i = t;
    for (; i + (copyUnroll - 1) * nth < n; i += copyUnroll * nth) {
        vec16 v[copyUnroll];
#pragma unroll
        for (int u = 0; u < copyUnroll; u++) v[u] = Fresh ? __ldcg(s + i + u * nth) : s[i + u * nth];
#pragma unroll
        for (int u = 0; u < copyUnroll; u++) d[i + u * nth] = v[u];
    }
    for (; i < n; i += nth) d[i] = Fresh ? __ldcg(s + i) : s[i];
}

#else  // the host

template <typename T>
inline std::atomic_ref<T> at(T *p) { return std::atomic_ref<T>(*p); }

inline void st_release_sys(uint64_t *p, uint64_t v) { at(p).store(v, std::memory_order_release); }
inline uint64_t ld_acquire_sys(const uint64_t *p) { return at(const_cast<uint64_t *>(p)).load(std::memory_order_acquire); }
inline uint64_t ld_u64(const uint64_t *p) { return at(const_cast<uint64_t *>(p)).load(std::memory_order_relaxed); }
inline void st_u64(uint64_t *p, uint64_t v) { at(p).store(v, std::memory_order_relaxed); }
inline int ld_i32(const int *p) { return at(const_cast<int *>(p)).load(std::memory_order_relaxed); }
inline void st_i32(int *p, int v) { at(p).store(v, std::memory_order_relaxed); }
inline void st_u32(unsigned *p, unsigned v) { at(p).store(v, std::memory_order_relaxed); }
inline unsigned add_u32(unsigned *p, unsigned v) { return at(p).fetch_add(v, std::memory_order_acq_rel); }
inline void fence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }
// A host has far fewer cores than a GPU has blocks: waiting threads let
// the others run.
inline void poll_pause(unsigned polls) {
    if (polls % 16 != 0) return;
    if (polls < 4096) {
        sched_yield();
    } else {  // a long wait: leave the cores to the threads it waits for
        struct timespec ts = {0, 20000};
        nanosleep(&ts, nullptr);
    }
}

inline uint64_t now_ns() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

template <bool Fresh, typename T>
inline void copy_elems(T *d, const T *s, uint64_t lo, uint64_t hi) {
    if (hi > lo) memcpy(d + lo, s + lo, (hi - lo) * sizeof(T));
}
struct vec16 {
    uint32_t x, y, z, w;
};

// A CUDA block of bdim threads, played by one host thread.
struct HostBlock {
    unsigned block, nblocks, bdim;
    bool leader() const { return true; }
    void sync() const {}
    unsigned blocks() const { return nblocks; }
    template <typename F>
    void each(int n, F f) const {
        for (int i = 0; i < n; i++) f(i);
    }
    template <typename F>
    void grid(uint64_t n, F f) const {
        const uint64_t nth = (uint64_t)nblocks * bdim;
        for (uint64_t base = (uint64_t)block * bdim; base < n; base += nth) f(base, base + bdim < n ? base + bdim : n);
    }
};

// copy_vecs copies n 16-byte elements: the block's runs of DevBlock's
// (see grid).
template <bool Fresh>
inline void copy_vecs(const HostBlock &x, vec16 *d, const vec16 *s, uint64_t n) {
    x.grid(n, [&](uint64_t lo, uint64_t hi) { copy_elems<Fresh>(d, s, lo, hi); });
}

#endif

// copy n bytes with the whole grid: 16-byte vectors where source and
// destination share their alignment, 4-byte words or bytes otherwise.
template <bool Fresh, typename X>
SLIME_DEV void grid_copy(const X &x, char *dst, const char *src, uint64_t n) {
    if (n == 0 || dst == src) return;
    if ((((uintptr_t)dst ^ (uintptr_t)src) & 15) == 0) {
        uint64_t head = (16 - ((uintptr_t)dst & 15)) & 15;
        if (head > n) head = n;
        x.grid(head, [&](uint64_t lo, uint64_t hi) { copy_elems<Fresh>(dst, src, lo, hi); });
        uint64_t vecs = (n - head) / 16;
        vec16 *d4 = (vec16 *)(dst + head);
        const vec16 *s4 = (const vec16 *)(src + head);
        copy_vecs<Fresh>(x, d4, s4, vecs);
        char *dt = dst + head + vecs * 16;
        const char *st = src + head + vecs * 16;
        x.grid(n - head - vecs * 16, [&](uint64_t lo, uint64_t hi) { copy_elems<Fresh>(dt, st, lo, hi); });
    } else if ((((uintptr_t)dst ^ (uintptr_t)src) & 3) == 0) {
        uint64_t head = (4 - ((uintptr_t)dst & 3)) & 3;
        if (head > n) head = n;
        x.grid(head, [&](uint64_t lo, uint64_t hi) { copy_elems<Fresh>(dst, src, lo, hi); });
        uint64_t words = (n - head) / 4;
        uint32_t *d = (uint32_t *)(dst + head);
        const uint32_t *s = (const uint32_t *)(src + head);
        x.grid(words, [&](uint64_t lo, uint64_t hi) { copy_elems<Fresh>(d, s, lo, hi); });
        char *dt = dst + head + words * 4;
        const char *st = src + head + words * 4;
        x.grid(n - head - words * 4, [&](uint64_t lo, uint64_t hi) { copy_elems<Fresh>(dt, st, lo, hi); });
    } else {
        x.grid(n, [&](uint64_t lo, uint64_t hi) { copy_elems<Fresh>(dst, src, lo, hi); });
    }
}

// Record a failure. The word is mapped host memory, where atomics need
// PCIe atomics that not every host has: a plain store, the first writer
// usually winning, any code being a correct report.
SLIME_DEV void set_status(uint64_t status, int code, int src) {
    int *w = (int *)SLIME_P(status);
    if (ld_i32(w) == 0) st_i32(w, code | (src << 8));
    fence_system();
}

SLIME_DEV bool failed(uint64_t status) { return ld_i32((const int *)SLIME_P(status)) != 0; }

// The leader of a block waits until source src's flag f (epoch, total)
// reaches epoch e and checks it against the total this rank expects; the
// whole block learns whether to go on. The wait takes any epoch from e on,
// not e alone: a rank whose status word is set stops waiting for its peers
// (its waits give up at the first look at the status), so its later
// launches run on without them and may lap a peer still waiting at e,
// raising e + 2 in the same slot. That rank announces poisoned totals from
// then on: a flag past e is the size status naming it, as reading its flag
// of that launch would be, and never a wait until the timeout (its scratch
// slot then holds a later launch's block, which is not copied). A healthy
// peer cannot raise e + 2 here before this rank has raised e + 1, so a
// flag past e means that the peer has failed. The leader alone reads and
// judges the flag, so that every thread of the block takes the same
// branch. The shared answer is read by every thread before the block
// syncs again, so that the leader cannot rewrite it (at its next wait)
// while a slow warp still reads this one.
template <typename X>
SLIME_DEV bool block_wait(const X &x, const uint64_t *f, uint64_t e, uint64_t total, uint64_t status, int src, uint64_t timeout_ns) {
    SLIME_SHARED int go;
    if (x.leader()) {
        go = 1;
        uint64_t start = now_ns();
        uint64_t v;
        for (unsigned polls = 1;; polls++) {
            v = ld_acquire_sys(f);
            if (v >= e) break;
            poll_pause(polls);
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
        if (go && (v != e || ld_u64(f + 1) != total)) {
            set_status(status, SLIME_AG_SIZE, src);
            go = 0;
        }
    }
    x.sync();
    const bool ok = go != 0;
    x.sync();
    return ok;
}

// The last block to arrive at counter (the leader of each block calls it)
// gets true, and resets the counter for the next launch.
template <typename X>
SLIME_DEV bool last_block(const X &x, unsigned *counter) {
    fence_system();
    unsigned prev = add_u32(counter, 1u);
    if (prev == x.blocks() - 1) {
        st_u32(counter, 0);
        fence_system();
        return true;
    }
    return false;
}

// The bit a failed rank sets in the totals it announces (no block is 2^63
// bytes or more).
#define SLIME_AG_POISON (1ull << 63)

// One launch (round) of the LL all-gather: see slime.h for the protocol.
template <typename X>
SLIME_DEV void allgather_ll(const X &x, const slime_ag_args &a) {
    SLIME_SHARED uint64_t epoch;
    unsigned *sync = (unsigned *)SLIME_P(a.sync);
    // Whether an earlier round or call of this rank failed (its status
    // word set), for the flags it raises below. The status word is host
    // memory: the load is issued now, into the leader's own register, so
    // that its latency passes under the copies rather than before the
    // flags every peer waits for (nothing in this launch sets it before
    // then).
    bool poisoned = false;
    if (x.leader()) {
        poisoned = failed(a.status);
        epoch = ld_u64((const uint64_t *)SLIME_P(a.epoch)) + 1;
    }
    x.sync();
    const uint64_t e = epoch;
    const uint64_t slot = e & 1;
    const uint64_t n = a.bytes < a.cap ? a.bytes : a.cap;
    const char *src = (const char *)SLIME_P(a.src);

    // 1. push to every peer, the next rank first
    for (int i = 1; i < a.nranks; i++) {
        int p = (a.rank + i) % a.nranks;
        char *d = (char *)SLIME_P(a.scratch[p]) + (slot * a.nranks + a.rank) * a.cap;
        grid_copy<false>(x, d, src, n);
    }
    fence_system();
    x.sync();
    if (x.leader() && last_block(x, &sync[0])) {
        // Once this rank's status word is set (a round or call of it
        // failed), its flags announce a total that no peer expects: the
        // rounds enqueued after the failure still run, in step, but a peer
        // that reads them fails with the size status instead of taking
        // them for its own call's blocks.
        const uint64_t total = poisoned ? a.total | SLIME_AG_POISON : a.total;
        for (int i = 1; i < a.nranks; i++) {
            int p = (a.rank + i) % a.nranks;
            uint64_t *f = (uint64_t *)SLIME_P(a.flags[p]) + (slot * a.nranks + a.rank) * 2;
            st_u64(f + 1, total);
            st_release_sys(f, e);
        }
    }
    // 2. own block
    grid_copy<false>(x, (char *)SLIME_P(a.dst) + a.off[a.rank], src, a.expect[a.rank]);

    // 3. every other block, from this rank's scratch
    const uint64_t *myflags = (const uint64_t *)SLIME_P(a.flags[a.rank]);
    const char *mine = (const char *)SLIME_P(a.scratch[a.rank]);
    for (int i = 1; i < a.nranks; i++) {
        int s = (a.rank - i + a.nranks) % a.nranks;
        const uint64_t *f = myflags + (slot * a.nranks + s) * 2;
        if (!block_wait(x, f, e, a.totals[s], a.status, s, a.timeout_ns)) break;
        uint64_t m = a.expect[s] < a.cap ? a.expect[s] : a.cap;
        grid_copy<true>(x, (char *)SLIME_P(a.dst) + a.off[s], mine + (slot * a.nranks + s) * a.cap, m);
    }
    x.sync();
    // 4. the last block out advances the epoch
    if (x.leader() && last_block(x, &sync[1])) st_u64((uint64_t *)SLIME_P(a.epoch), e);
}

// The flag barrier (one block): see slime.h.
template <typename X>
SLIME_DEV void barrier(const X &x, const slime_barrier_args &a) {
    SLIME_SHARED uint64_t epoch;
    if (x.leader()) epoch = ld_u64((const uint64_t *)SLIME_P(a.epoch)) + 1;
    x.sync();
    const uint64_t e = epoch;
    x.each(a.nranks, [&](int p) { st_release_sys((uint64_t *)SLIME_P(a.flags[p]) + a.rank, e); });
    const uint64_t *mine = (const uint64_t *)SLIME_P(a.flags[a.rank]);
    x.each(a.nranks, [&](int s) {
        uint64_t start = now_ns();
        for (unsigned polls = 1; ld_acquire_sys(mine + s) < e; polls++) {
            poll_pause(polls);
            if (polls % 256 != 0) continue;
            if (failed(a.status)) break;
            if (now_ns() - start > a.timeout_ns) {
                set_status(a.status, SLIME_AG_TIMEOUT, s);
                break;
            }
        }
    });
    x.sync();
    if (x.leader()) st_u64((uint64_t *)SLIME_P(a.epoch), e);
}

}  // namespace slime_proto

#endif  // SLIME_PROTOCOL_H
