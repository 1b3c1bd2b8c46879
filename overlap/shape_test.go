package overlap_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/testranks"
	"github.com/slimego/slimego/overlap"
)

// TestNewShapeOverflow: a shape whose matrices' byte counts overflow int
// (k = 2^62: m·k·4 wraps to 0, and so do the others) is ErrInvalid, an
// *OpError naming the rank, on every rank, before anything is allocated,
// as a negative one is; New never plans buffers smaller than the shape.
func TestNewShapeOverflow(t *testing.T) {
	testranks.Run(t, 1, 2, nil, func(c *collective.Communicator) error {
		ctx := context.Background()
		for _, sh := range [][3]int{{1, 1, 1 << 62}, {1 << 62, 1, 1}, {1, 1 << 62, 1}, {1 << 61, 1, 1}, {math.MaxInt, math.MaxInt, math.MaxInt}, {-1, 1, 1}} {
			o, err := overlap.New[float32](ctx, c, sh[0], sh[1], sh[2], 2)
			if err == nil {
				o.Close()
			}
			var oe *collective.OpError
			if !errors.Is(err, collective.ErrInvalid) || !errors.As(err, &oe) || oe.Rank != c.Rank() {
				return fmt.Errorf("New %d×%d×%d: %v, want ErrInvalid naming rank %d", sh[0], sh[1], sh[2], err, c.Rank())
			}
		}
		return nil
	})
}

// TestRunAfterCommunicatorClose: once the communicator is closed (its
// stream with it: on CUDA the stream's handle is destroyed), every run of
// an Op planned on it is ErrClosed naming the rank, on both backends,
// before any work is recorded on the stream it kept (the emulator rejects
// a destroyed handle, which the run then reported instead).
func TestRunAfterCommunicatorClose(t *testing.T) {
	for _, backend := range []device.Kind{device.CPU, device.CUDA} {
		t.Run(backend.String(), func(t *testing.T) {
			testranks.Run(t, 1, 2, func(o *collective.Options) {
				o.Backend, o.Timeout = backend, 30*time.Second
			}, func(c *collective.Communicator) error {
				ctx := context.Background()
				o, err := overlap.New[float32](ctx, c, 4, 4, 4, 2)
				if err != nil {
					return err
				}
				if err := o.Run(ctx); err != nil {
					return err
				}
				if err := c.Close(); err != nil {
					return err
				}
				for name, call := range map[string]func() error{
					"Run":           func() error { return o.Run(ctx) },
					"RunSequential": func() error { return o.RunSequential(ctx) },
					"Gather":        func() error { return o.Gather(ctx) },
					"GEMM":          func() error { return o.GEMM(ctx) },
				} {
					err := call()
					var oe *collective.OpError
					if !errors.Is(err, collective.ErrClosed) || !errors.As(err, &oe) || oe.Rank != c.Rank() {
						return fmt.Errorf("%s after the communicator's Close: %v, want ErrClosed naming rank %d", name, err, c.Rank())
					}
				}
				o.Close()
				return nil
			})
		})
	}
}
