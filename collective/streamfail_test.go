package collective_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/pattern"
)

// TestStreamFailureLeavesNoGatherBehind: on the CPU backend a plan of
// buffers first waits for the work on Stream(). Where that work failed,
// Launch returns the failure without taking part in the gather its peers
// are already in. The peers must then learn of it at once (an error
// naming rank 1), not wait out their timeout and not take rank 1's next
// Launch (after the stream's Reset, with the next iteration's data) for
// the one it refused: no rank returns nil with a block of another
// iteration. As where every rank's work failed, the communicator stays
// usable: the next iteration gathers every byte.
func TestStreamFailureLeavesNoGatherBehind(t *testing.T) {
	const n = 4096
	inProcess(t, 2, func(c *collective.Communicator) error {
		ctx := context.Background()
		me := c.Rank()
		src := device.NewHostBuffer(make([]byte, n), false)
		dst := device.NewHostBuffer(make([]byte, 2*n), false)
		p, err := c.PlanBuffers(ctx, dst, src)
		if err != nil {
			return err
		}
		defer p.Close()
		check := func(it int) error {
			for r := range 2 {
				if i := pattern.Check(dst.Bytes()[r*n:r*n+n], pattern.Seed(r, it, 0)); i >= 0 {
					return fmt.Errorf("iteration %d returned nil, but rank %d's block is not its iteration %d data (wrong at byte %d)", it, r, it, i)
				}
			}
			return nil
		}
		st := c.Stream().(*device.CPUStream)
		if me == 1 {
			st.Launch(func() error { return errors.New("the work before the gather failed") })
			if err := p.Launch(ctx); err == nil {
				return errors.New("Launch after the stream's work failed: nil")
			}
			st.Reset()
			pattern.Fill(src.Bytes(), pattern.Seed(me, 1, 0))
			if err := p.Launch(ctx); err != nil {
				return fmt.Errorf("the next iteration: %w", err)
			}
			return check(1)
		}
		pattern.Fill(src.Bytes(), pattern.Seed(me, 0, 0))
		start := time.Now()
		err = p.Launch(ctx)
		if err == nil {
			return check(0)
		}
		var oe *collective.OpError
		if !errors.As(err, &oe) || oe.Peer != 1 {
			return fmt.Errorf("want an error naming peer 1, got %v", err)
		}
		if took := time.Since(start); took > 5*time.Second {
			return fmt.Errorf("the error took %v: %v", took, err)
		}
		pattern.Fill(src.Bytes(), pattern.Seed(me, 1, 0))
		if err := p.Launch(ctx); err != nil {
			return fmt.Errorf("the next iteration: %w", err)
		}
		return check(1)
	})
}

// TestClosedPlanLeavesNoGatherBehind: a launch of a plan that this rank
// has closed (and its peers have not) is ErrClosed here; it must not let
// the peers take this rank's next call, of another plan, for it.
func TestClosedPlanLeavesNoGatherBehind(t *testing.T) {
	const n = 4096
	inProcess(t, 2, func(c *collective.Communicator) error {
		ctx := context.Background()
		me := c.Rank()
		var plans [2]*collective.Plan
		var dsts [2]*device.HostBuffer
		for i := range plans {
			src := device.NewHostBuffer(make([]byte, n), false)
			pattern.Fill(src.Bytes(), pattern.Seed(me, i, 0))
			dsts[i] = device.NewHostBuffer(make([]byte, 2*n), false)
			p, err := c.PlanBuffers(ctx, dsts[i], src)
			if err != nil {
				return err
			}
			plans[i] = p
		}
		if me == 1 {
			plans[0].Close()
		}
		for i, p := range plans {
			err := p.Launch(ctx)
			if me == 1 && i == 0 {
				if !errors.Is(err, collective.ErrClosed) {
					return fmt.Errorf("Launch of a closed plan: %v, want ErrClosed", err)
				}
				continue
			}
			if err != nil {
				continue // an error is a fair answer; another plan's data is not
			}
			for r := range 2 {
				if j := pattern.Check(dsts[i].Bytes()[r*n:r*n+n], pattern.Seed(r, i, 0)); j >= 0 {
					return fmt.Errorf("plan %d returned nil, but rank %d's block is another plan's (wrong at byte %d)", i, r, j)
				}
			}
		}
		return nil
	})
}
