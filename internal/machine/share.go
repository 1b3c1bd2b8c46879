package machine

import (
	"fmt"
	"math"
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

// DescriptorShare is the most descriptors a listener's connections from
// anyone who reaches its port (before they prove anything) may hold:
// three quarters of those this process may open (at least 16), so that a
// flood of them cannot take the descriptors the rest of the process
// needs (its links, shared memory, a launcher's workers' pipes).
func DescriptorShare() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur > math.MaxInt32 {
		return math.MaxInt32
	}
	return max(int(lim.Cur/4*3), 16)
}
