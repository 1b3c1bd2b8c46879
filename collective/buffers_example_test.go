package collective_test

import (
	"context"
	"fmt"

	"github.com/slimego/slimego/collective"
)

// The backend-neutral form: buffers of the communicator's device, a plan
// ordered on its stream, and Synchronize at the end. The same code runs on
// the CUDA backend, where the buffers are device memory.
func ExampleCommunicator_PlanBuffers() {
	ctx := context.Background()
	errs := collective.RunInProcess(ctx, 1, 2, nil, func(c *collective.Communicator) error {
		dev, s := c.Device(), c.Stream()
		src, err := dev.NewBuffer(4)
		if err != nil {
			return err
		}
		defer src.Free()
		dst, err := dev.NewBuffer(4 * c.Size())
		if err != nil {
			return err
		}
		defer dst.Free()
		plan, err := c.PlanBuffers(ctx, dst, src)
		if err != nil {
			return err
		}
		defer plan.Close()
		if err := src.CopyIn([]byte{1, 2, 3, byte(c.Rank())}); err != nil {
			return err
		}
		if err := plan.Launch(ctx); err != nil {
			return err
		}
		if err := c.Synchronize(ctx, s); err != nil {
			return err
		}
		if err := plan.Check(ctx); err != nil {
			return err
		}
		out := make([]byte, dst.Size())
		if err := dst.CopyOut(out); err != nil {
			return err
		}
		if c.Rank() == 0 {
			fmt.Println(c.Device().Kind(), out)
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			fmt.Println("rank", r, err)
		}
	}
	// Output: cpu [1 2 3 0 1 2 3 1]
}
