package machine

import (
	"fmt"
	"math"
	"sync/atomic"
	"syscall"
)

// Share is the most memory one of ranks processes of this machine should
// allocate, in bytes, and what bounds it, for a program's check of its
// sizes before it allocates: the memory available (Memory) divided among
// them, or, where that cannot be read, what an int (a slice's length, an
// offset) holds.
func Share(ranks int) (limit int64, what string) {
	ranks = max(ranks, 1)
	avail, _, ok := Memory()
	if !ok || avail/int64(ranks) >= math.MaxInt {
		return math.MaxInt, "an int holds"
	}
	if ranks == 1 {
		return avail, "memory available"
	}
	return avail / int64(ranks), fmt.Sprintf("memory available to each of %d ranks of this machine", ranks)
}

// DescriptorShare is the most descriptors the connections from anyone
// who reaches one of this process's listeners (before they prove
// anything) may hold, all listeners together (TakeUnproven): three
// quarters of those this process may open (at least 16), so that a flood
// of them cannot take the descriptors the rest of the process needs (its
// links, shared memory, a launcher's workers' pipes). The limit is read
// at each call: a limit raised later (prlimit) counts.
func DescriptorShare() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur > math.MaxInt32 {
		return math.MaxInt32
	}
	return max(int(lim.Cur/4*3), 16)
}

// unproven counts the connections this process's listeners hold that have
// not proven anything yet (TakeUnproven).
var unproven atomic.Int64

// TakeUnproven reserves, for a connection a listener is about to accept
// from anyone, one of the process's DescriptorShare, which the store and
// every p2p endpoint of the process draw from together: two listeners in
// one process (rank 0's store and its endpoint) must not hold twice the
// share. It reports false where the share is taken; ReleaseUnproven gives
// the reservation back once the connection has proven itself or closed.
func TakeUnproven() bool {
	share := int64(DescriptorShare())
	for {
		n := unproven.Load()
		if n >= share {
			return false
		}
		if unproven.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// ReleaseUnproven gives back one reservation of TakeUnproven.
func ReleaseUnproven() { unproven.Add(-1) }
