package collective_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"testing"

	"github.com/slimego/slimego/collective"
)

// TestClosedPlanRefused: a plan of byte slices (Communicator.Plan) whose
// Close was called refuses its later runs with ErrClosed, as a plan of
// device.Buffer values does on either backend (a Plan is one type
// whatever it was made from), and takes part as a refused call: the
// other ranks' call fails naming that rank, and the communicator stays in
// step. It ran the gather and returned nil.
func TestClosedPlanRefused(t *testing.T) {
	for _, tc := range []struct{ P, who int }{{1, 0}, {3, 2}} {
		t.Run(fmt.Sprintf("P=%d", tc.P), func(t *testing.T) {
			var others []int
			for r := range tc.P {
				if r != tc.who {
					others = append(others, r)
				}
			}
			j := expectFault(t, nil, tc.P, others, "--fault", "closed-plan", "--fault-rank", fmt.Sprint(tc.who), "--fault-size", "4099")
			if !regexp.MustCompile(fmt.Sprintf(`(?m)^\[%d\]: EXPECTED rank %d: allgather rank %d: slimego: plan closed: Plan.Close was called; the communicator is open: plan the call again`, tc.who, tc.who, tc.who)).MatchString(j.out) {
				t.Errorf("rank %d's run of its closed plan was not ErrClosed:\n%s\n%s", tc.who, j.out, j.stderr)
			}
		})
	}
}

// TestPlanCloseDuringRun: a plan's Close from another goroutine while a
// run is in progress (a misuse: Close is a collective call, made between
// runs) is no data race on the plan's closed flag (go test -race): the
// run either gathers or is refused as closed. (The flag was a plain bool.)
func TestPlanCloseDuringRun(t *testing.T) {
	inProcess(t, 1, func(c *collective.Communicator) error {
		ctx := context.Background()
		src, dst := make([]byte, 64), make([]byte, 64)
		p, err := c.Plan(dst, src)
		if err != nil {
			return err
		}
		done := make(chan struct{})
		go func() { defer close(done); p.Close() }()
		for range 100 {
			if err := p.Run(ctx); err != nil && !errors.Is(err, collective.ErrClosed) {
				return err
			}
		}
		<-done
		return nil
	})
}
