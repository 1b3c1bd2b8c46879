package collective

import "github.com/slimego/slimego/internal/fault"

// PlanBlocks prepares an all-gather with explicit placement: rank r's
// sizes[r] bytes land at offs[r] of dst on every rank, src being this
// rank's block. Every rank passes the same sizes (offsets are its own
// business). It is what an operator needs when the gathered blocks are not
// contiguous — rows of a matrix gathered piece by piece, for instance.
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
	copy(c.sizes, sizes)
	copy(c.offs, offs)
	return c.hostPlan("allgatherv", dst, src)
}
