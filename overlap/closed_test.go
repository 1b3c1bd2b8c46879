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

// TestClosedIsErrClosed: planning on a closed communicator, and running a
// closed Op, are ErrClosed, not a crash (a failed plan once left a nil
// engine that Close then called).
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
		if err := o.Run(ctx); !errors.Is(err, collective.ErrClosed) {
			return fmt.Errorf("Run after Close: %v, want ErrClosed", err)
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
