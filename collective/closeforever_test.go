package collective

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"
)

// TestCloseWaitsWithHugeTimeout: a Timeout as large as a Duration holds
// ("no timeout") must not overflow Close's wait for a call of another
// goroutine: Close once returned at once, closing nothing, saying it had
// waited a negative time.
func TestCloseWaitsWithHugeTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := RunInProcess(ctx, 1, 2, func(o *Options) { o.Timeout = math.MaxInt64 }, func(c *Communicator) error {
		dst := make([]byte, 2)
		if c.Rank() == 1 {
			time.Sleep(300 * time.Millisecond)
			return c.AllGather(ctx, dst, []byte{1})
		}
		done := make(chan error, 1)
		go func() { done <- c.AllGather(ctx, dst, []byte{0}) }()
		time.Sleep(50 * time.Millisecond) // the call is in progress
		if err := c.Close(); err != nil {
			return fmt.Errorf("close during a call, Timeout %v: %v", time.Duration(math.MaxInt64), err)
		}
		return <-done
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}
