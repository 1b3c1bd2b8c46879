package collective

import (
	"cmp"
	"slices"

	"github.com/slimego/slimego/internal/fault"
)

// PlanBlocks prepares an all-gather with explicit placement: rank r's
// sizes[r] bytes land at offs[r] of dst on every rank, src being this
// rank's block. Every rank passes the same sizes (offsets are its own
// business). It is what an operator needs when the gathered blocks are not
// contiguous — rows of a matrix gathered piece by piece, for instance.
// Blocks that share bytes of dst are ErrInvalid.
func (c *Communicator) PlanBlocks(dst, src []byte, sizes, offs []int) (*Plan, error) {
	if err := c.enter("allgather"); err != nil {
		return nil, err
	}
	defer c.leave()
	if c.eng == nil {
		return nil, c.closedErr("plan")
	}
	if len(sizes) != c.Size() || len(offs) != c.Size() {
		return nil, fault.New("allgather", c.Rank(), -1, ErrInvalid, "%d sizes and %d offsets for %d ranks", len(sizes), len(offs), c.Size())
	}
	if err := checkOverlap("allgather", c.Rank(), len(dst), sizes, offs); err != nil {
		return nil, err
	}
	copy(c.sizes, sizes)
	copy(c.offs, offs)
	return c.hostPlan("allgatherv", dst, src)
}

// checkOverlap is ErrInvalid from op on rank naming two blocks that
// share bytes of a destination of dstLen bytes (overlapping), or nil.
func checkOverlap(op string, rank, dstLen int, sizes, offs []int) error {
	if a, b, ok := overlapping(dstLen, sizes, offs); ok {
		return fault.New(op, rank, -1, ErrInvalid, "blocks of ranks %d (%d bytes at %d) and %d (%d bytes at %d) overlap in the destination",
			a, sizes[a], offs[a], b, sizes[b], offs[b])
	}
	return nil
}

// overlapping finds two non-empty blocks that share bytes of a
// destination of dstLen bytes (a before b in it): each would leave there
// whichever arrived last, not the same bytes on every rank. Blocks that
// do not fit are left to the engine's bounds checks (their ends may
// wrap).
func overlapping(dstLen int, sizes, offs []int) (a, b int, ok bool) {
	var idx []int
	for r := range sizes {
		if sizes[r] > 0 && offs[r] >= 0 && offs[r] <= dstLen && sizes[r] <= dstLen-offs[r] {
			idx = append(idx, r)
		}
	}
	slices.SortStableFunc(idx, func(x, y int) int { return cmp.Compare(offs[x], offs[y]) })
	reach := -1 // the block that reaches furthest so far
	for _, r := range idx {
		if reach >= 0 && offs[r] < offs[reach]+sizes[reach] {
			return reach, r, true
		}
		if reach < 0 || offs[r]+sizes[r] > offs[reach]+sizes[reach] {
			reach = r
		}
	}
	return 0, 0, false
}
