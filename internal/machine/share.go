package machine

import (
	"fmt"
	"math"
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
