package interleave

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/internal/testranks"
)

// TestTime: two ways on two ranks, where rank 1 sleeps 3 ms in the first
// and rank 0 none; every iteration of the first way must show the slower
// rank's 3 ms on both ranks, the second way must stay short, the ways must
// alternate, and the count must follow the rule.
func TestTime(t *testing.T) {
	for _, tc := range []struct {
		rule Rule
		want int
	}{
		{Rule{MinIters: 4, MaxIters: 6, MinTime: time.Second}, 6},      // capped
		{Rule{MinIters: 7, MaxIters: 6, MinTime: time.Millisecond}, 7}, // at least MinIters
		{Rule{MinTime: 300 * time.Millisecond}, 0},                     // 0.3 s of 3 ms runs: about 100
	} {
		rule := tc.rule
		testranks.Run(t, 1, 2, nil, func(c *collective.Communicator) error {
			want := tc.want
			var order []int
			ways := []func(context.Context) error{
				func(context.Context) error {
					order = append(order, 0)
					if c.Rank() == 1 {
						time.Sleep(3 * time.Millisecond)
					}
					return nil
				},
				func(context.Context) error { order = append(order, 1); return nil },
			}
			per, err := Time(context.Background(), c, ways, rule)
			if err != nil {
				return err
			}
			n := len(per[0])
			if want == 0 && n >= 30 && n <= 100 {
				want = n // the machine's sleeps overshoot, so a range
			}
			if len(per) != 2 || n != want || len(per[1]) != want {
				return fmt.Errorf("rule %+v: %d ways of %d and %d iterations, want 2 of %d", rule, len(per), len(per[0]), len(per[1]), want)
			}
			for i := range want {
				if per[0][i] < 3000 || per[1][i] >= 3000 {
					return fmt.Errorf("iteration %d: %.0f µs and %.0f µs; want the slow rank's 3 ms in the first way only", i, per[0][i], per[1][i])
				}
			}
			for i, w := range order {
				if w != i%2 {
					return fmt.Errorf("run %d was way %d: the ways do not alternate", i, w)
				}
			}
			return nil
		})
	}
}

func TestMedian(t *testing.T) {
	xs := []float64{5, 1, 4, 2}
	if m := Median(xs); m != 3 || xs[0] != 5 {
		t.Errorf("Median = %v (input now %v), want 3 and the input untouched", m, xs)
	}
	if m := Median([]float64{9, 1, 5}); m != 5 {
		t.Errorf("Median = %v, want 5", m)
	}
	if m := Median(nil); m != 0 {
		t.Errorf("Median(nil) = %v", m)
	}
}
