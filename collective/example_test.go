package collective_test

import (
	"context"
	"fmt"

	"github.com/slimego/slimego/collective"
)

// Four ranks on two nodes (shared memory within a node, TCP between the
// nodes over loopback), as goroutines of this process: every rank
// contributes its own bytes and gets everyone's.
func ExampleRunInProcess() {
	ctx := context.Background()
	errs := collective.RunInProcess(ctx, 2, 2, nil, func(c *collective.Communicator) error {
		src := []byte{byte('a' + c.Rank()), byte('A' + c.Rank())}
		dst := make([]byte, 2*c.Size())
		if err := c.AllGather(ctx, dst, src); err != nil {
			return err
		}
		if c.Rank() == 0 {
			fmt.Printf("%d ranks on %d nodes: %s\n", c.Size(), c.Nodes(), dst)
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			fmt.Println("rank", r, err)
		}
	}
	// Output: 4 ranks on 2 nodes: aAbBcCdD
}

// A plan fixes the buffers once; running it allocates nothing, which is
// what a training loop calls every step.
func ExampleCommunicator_Plan() {
	ctx := context.Background()
	errs := collective.RunInProcess(ctx, 1, 2, nil, func(c *collective.Communicator) error {
		src := make([]byte, 4)
		dst := make([]byte, 4*c.Size())
		plan, err := c.Plan(dst, src)
		if err != nil {
			return err
		}
		for step := range 3 {
			for i := range src {
				src[i] = byte(10*step + c.Rank())
			}
			if err := plan.Run(ctx); err != nil {
				return err
			}
			if c.Rank() == 0 {
				fmt.Println("step", step, dst)
			}
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			fmt.Println("rank", r, err)
		}
	}
	// Output:
	// step 0 [0 0 0 0 1 1 1 1]
	// step 1 [10 10 10 10 11 11 11 11]
	// step 2 [20 20 20 20 21 21 21 21]
}
