package bench

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/slimego/slimego/internal/interleave"
)

// Memcpy measures one core's copy bandwidth for n-byte copies between two
// buffers allocated and touched once (so that no first-touch cost is
// timed): the ceiling a shared-memory all-gather, which copies, works under.
// It returns the median time of one copy (µs) and its bandwidth (GB/s).
func Memcpy(n int, minTime time.Duration) (us, gbps float64) {
	return MemcpyThreads(n, 1, minTime)
}

// MemcpyThreads measures the copy bandwidth of threads threads that copy
// n bytes together, each its own contiguous share (n/threads, the last the
// remainder) between buffers allocated and touched once. Each thread is an
// OS thread of its own that polls for the start of the next copy, so that
// no wake-up is timed. With threads = 2 it is the bound of two ranks on
// one node that each copy half of what the pair copies, as an out-of-place
// all-gather of two ranks does (each writes its own block and its peer's).
// It returns the median time of one copy, from its start until the last
// thread is done (µs), and n over that time (GB/s).
func MemcpyThreads(n, threads int, minTime time.Duration) (us, gbps float64) {
	if n == 0 {
		return 0, 0
	}
	threads = max(1, min(threads, n))
	a, b := make([]byte, n), make([]byte, n)
	for i := range a {
		a[i] = byte(i*7 + 1)
	}
	copy(b, a)
	per := n / threads
	share := func(t int) (lo, hi int) {
		lo = t * per
		if t == threads-1 {
			return lo, n
		}
		return lo, lo + per
	}
	// start counts copies begun; done counts shares finished, ever.
	var start, done atomic.Int64
	var wg sync.WaitGroup
	for t := 1; t < threads; t++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			lo, hi := share(t)
			for gen := int64(1); ; gen++ {
				for start.Load() < gen {
					if start.Load() < 0 {
						return
					}
				}
				copy(b[lo:hi], a[lo:hi])
				done.Add(1)
			}
		}()
	}
	lo0, hi0 := share(0)
	one := func(gen int64) {
		start.Store(gen)
		copy(b[lo0:hi0], a[lo0:hi0])
		want := gen * int64(threads-1)
		for done.Load() < want {
		}
	}
	one(1) // warm the other threads' caches and pages too
	var times []float64
	t := time.Now()
	for gen := int64(2); len(times) < 5 || time.Since(t) < minTime; gen++ {
		t0 := time.Now()
		one(gen)
		times = append(times, float64(time.Since(t0).Nanoseconds())/1e3)
		if len(times) >= 1_000_000 {
			break
		}
	}
	start.Store(-1)
	wg.Wait()
	us = interleave.Median(times)
	if us > 0 {
		gbps = float64(n) / (us * 1e-6) / 1e9
	}
	return us, gbps
}

// GatherCopy measures the copies of a shared-memory all-gather of P ranks
// with P threads, each a rank: P sources of s bytes, every thread copying
// each source it gathers into a destination of its own (P·s bytes), in
// the order source t, t+1, … (rank t's own first). Out of place a thread
// copies all P blocks; in place, the P−1 that are not its own. That is the
// all-gather's memory traffic with nothing else (no flags, no waits for
// peers), so its time at size s bounds the all-gather's at s; a ratio of
// the two is the share of the bound reached. Each thread is an OS thread
// of its own that polls for the start of the next round, so that no
// wake-up is timed, bound to a CPU of its own where there are enough (as
// make bench binds the ranks: a thread that polls must not wait for the
// core of the thread it polls for). It returns the median time of one
// round, from its start until the last thread is done (µs), and the bytes
// of the threads' destinations that differ from the sources after the
// last round, every block compared (the all-gather table's #wrong).
func GatherCopy(s, P int, inPlace bool, minTime time.Duration) (us float64, wrong int64) {
	if s == 0 || P < 1 {
		return 0, 0
	}
	srcs := make([][]byte, P)
	dsts := make([][]byte, P)
	for t := range P {
		srcs[t] = make([]byte, s)
		for i := range srcs[t] {
			srcs[t][i] = byte(i*7 + t + 1)
		}
		dsts[t] = make([]byte, P*s)
		copy(dsts[t][t*s:], srcs[t]) // in place: the own block is there
	}
	round := func(t int) {
		for k := range P {
			j := (t + k) % P
			if j == t && inPlace {
				continue
			}
			copy(dsts[t][j*s:(j+1)*s], srcs[j])
		}
	}
	var start, done atomic.Int64
	var wg sync.WaitGroup
	for t := 1; t < P; t++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			defer bindThread(t, P)()
			for gen := int64(1); ; gen++ {
				for start.Load() < gen {
					if start.Load() < 0 {
						return
					}
				}
				round(t)
				done.Add(1)
			}
		}()
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer bindThread(0, P)()
	one := func(gen int64) {
		start.Store(gen)
		round(0)
		for want := gen * int64(P-1); done.Load() < want; {
		}
	}
	one(1) // touch every page, warm the caches
	var times []float64
	t := time.Now()
	for gen := int64(2); len(times) < 5 || time.Since(t) < minTime; gen++ {
		t0 := time.Now()
		one(gen)
		times = append(times, float64(time.Since(t0).Nanoseconds())/1e3)
		if len(times) >= 1_000_000 {
			break
		}
	}
	start.Store(-1)
	wg.Wait()
	if testHookGatherCopied != nil {
		testHookGatherCopied(dsts)
	}
	for t := range P {
		for j := range P {
			wrong += countWrongBytes(dsts[t][j*s:(j+1)*s], srcs[j])
		}
	}
	return interleave.Median(times), wrong
}

// testHookGatherCopied, set by tests, is called with GatherCopy's
// destinations after its last round, before they are checked.
var testHookGatherCopied func(dsts [][]byte)
