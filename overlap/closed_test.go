package overlap_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/internal/testranks"
	"github.com/slimego/slimego/overlap"
)

// TestClosedIsErrClosed: planning on a closed communicator, and every
// call on a closed Op (its runs, its copies in and out), are ErrClosed,
// not a crash (a failed plan once left a nil engine that Close then
// called); a second Close does nothing.
func TestClosedIsErrClosed(t *testing.T) {
	testranks.Run(t, 1, 2, nil, func(c *collective.Communicator) error {
		ctx := context.Background()
		o, err := overlap.New[float32](ctx, c, 4, 4, 4, 2)
		if err != nil {
			return err
		}
		if err := o.Close(); err != nil {
			return err
		}
		for name, call := range map[string]func() error{
			"Run":           func() error { return o.Run(ctx) },
			"RunSequential": func() error { return o.RunSequential(ctx) },
			"Gather":        func() error { return o.Gather(ctx) },
			"GEMM":          func() error { return o.GEMM(ctx) },
			"WriteA":        func() error { return o.WriteA(make([]float32, 16)) },
			"ReadC":         func() error { return o.ReadC(make([]float32, 32)) },
		} {
			if err := call(); !errors.Is(err, collective.ErrClosed) {
				return fmt.Errorf("%s after Close: %v, want ErrClosed", name, err)
			}
		}
		if err := o.Close(); err != nil {
			return fmt.Errorf("a second Close: %v", err)
		}
		if o.Mode() != "closed" {
			return fmt.Errorf("Mode after Close: %q", o.Mode())
		}
		c.Close()
		if _, err := overlap.New[float32](ctx, c, 4, 4, 4, 2); !errors.Is(err, collective.ErrClosed) {
			return fmt.Errorf("New on a closed communicator: %v, want ErrClosed", err)
		}
		return nil
	})
}
