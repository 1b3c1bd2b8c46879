package collective_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/testranks"
)

// Where the node's GPUs cannot reach each other (forced here: on the
// emulator every rank shares one GPU), Init chooses the host-staged engine
// for device memory: on one node of 2 and 3 ranks, and across 2 nodes of
// 2 under hier; under the ring across nodes it runs the ring over the
// staged link, which needs no LL group. Equal, uneven (an empty block
// included) and placed blocks, in place and not, through the old and the
// backend-neutral API (the latter ordered between copies on Stream()),
// every byte checked; planned runs allocate nothing.
func TestGPUHostStaged(t *testing.T) {
	needGPU(t)
	for _, tc := range []struct {
		name           string
		nodes, perNode int
		algo, mode     string
		describe       string
	}{
		{"1x2", 1, 2, "", "host-staged", "within the node: host-staged"},
		{"1x3", 1, 3, "", "host-staged", "within the node: host-staged"},
		{"2x2/hier", 2, 2, "hier", "host-staged", "across nodes: host-staged tcp"},
		{"2x2/ring", 2, 2, "ring", "staged", "across nodes: ring over host-staged tcp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			undo := collective.ForceNoP2P()
			defer undo()
			testranks.Run(t, tc.nodes, tc.perNode, func(o *collective.Options) {
				o.Backend, o.GPUScratch, o.Algo, o.Timeout = device.CUDA, gpuScratch, tc.algo, 30*time.Second
			}, func(c *collective.Communicator) error {
				ctx := context.Background()
				P := c.Size()
				for _, counts := range [][]int{
					[]int{4097, 4097, 4097, 4097}[:P],
					[]int{70_001, 0, 5, 64 << 10}[:P],
				} {
					for _, inPlace := range []bool{false, true} {
						if _, err := gatherGPU(ctx, c, counts, inPlace, 3); err != nil {
							return fmt.Errorf("counts %v, in place %v: %w", counts, inPlace, err)
						}
					}
				}
				sizes, offs, end := make([]int, P), make([]int, P), 7
				for r := P - 1; r >= 0; r-- {
					sizes[r], offs[r] = 1000+37*r+r%2*50_000, end
					end += sizes[r] + 13
				}
				var mode, desc string
				var capt bool
				if err := gatherBuffers(ctx, c, end, sizes, offs, false, 2, func(dst, src device.Buffer) (*collective.Plan, error) {
					p, err := c.PlanBuffersBlocks(ctx, dst, src, sizes, offs)
					if err == nil {
						mode, desc, capt = p.Mode(), p.String(), collective.Capturable(p)
					}
					return p, err
				}); err != nil {
					return err
				}
				if mode != tc.mode || !strings.Contains(desc, tc.describe) || capt {
					return fmt.Errorf("plan %q, mode %s, capturable %v: want mode %s, %q, not capturable", desc, mode, capt, tc.mode, tc.describe)
				}
				return nil
			})
		})
	}
}
