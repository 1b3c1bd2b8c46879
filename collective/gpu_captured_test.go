package collective_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/cudagraph"
)

// TestGPUPlanCapturedWhenMade: in graph mode a plan's CUDA graph is
// captured when the plan is made, before its barrier, not at its first
// Run: a capture (a first launch under lazy module loading) while a peer's
// kernel already spins waiting for this rank would stall both. In eager
// mode nothing is captured.
func TestGPUPlanCapturedWhenMade(t *testing.T) {
	needGPU(t)
	if cudagraph.Eager() {
		t.Skip("SLIME_EAGER asks for eager mode")
	}
	const P, n = 2, 1000
	for _, eager := range []bool{false, true} {
		t.Run(fmt.Sprintf("eager=%v", eager), func(t *testing.T) {
			gpuRanks(t, P, eager, 0, func(c *collective.Communicator) error {
				ctx := context.Background()
				dst, src, err := rankBlocksGPU(c, n)
				if err != nil {
					return err
				}
				defer dst.Free()
				plan, err := c.PlanBuffers(ctx, dst, src)
				if err != nil {
					return err
				}
				defer plan.Close()
				if !collective.Capturable(plan) {
					return fmt.Errorf("%s plan (%s): not a plan of kernels", plan.Mode(), plan)
				}
				if got := collective.Captured(plan); got == eager {
					return fmt.Errorf("%s mode: captured %v right after PlanBuffers", plan.Mode(), got)
				}
				if err := plan.Run(ctx); err != nil {
					return err
				}
				if got := collective.Captured(plan); got == eager {
					return fmt.Errorf("%s mode: captured %v after a Run", plan.Mode(), got)
				}
				return checkRankBlocks(dst, n)
			})
		})
	}
}
