package collective

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

// TestCountsThatWrap: AllGatherV counts whose sum wraps round an int
// (two of math.MaxInt) are refused as invalid saying so, on the rank
// that passed them, not measured against the destination as a small
// sum.
func TestCountsThatWrap(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := RunInProcess(ctx, 1, 2, func(o *Options) { o.Timeout = 5 * time.Second }, func(c *Communicator) error {
		err := c.layoutV([]int{math.MaxInt, math.MaxInt}, 16)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "more than an int holds") {
			return fmt.Errorf("counts that wrap: %v", err)
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}
