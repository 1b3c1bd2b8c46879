package collective_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/collective"
)

// TestInitAgain: Init again, with the same options, while this rank's
// communicator of the job is open is ErrInvalid at once on every rank that
// does it (all of them, or one), touching neither the store nor the open
// communicator, which goes on working. Ranks of one process (RunInProcess)
// are not affected: each is its own rank.
func TestInitAgain(t *testing.T) {
	for _, again := range []string{"every", "one"} {
		t.Run(again, func(t *testing.T) {
			opts := make([]collective.Options, 3) // each rank's, as RunInProcess made them
			tune := func(o *collective.Options) { opts[o.Rank] = *o }
			inProcessNodes(t, 1, 3, tune, func(c *collective.Communicator) error {
				ctx := context.Background()
				me := c.Rank()
				if again == "every" || me == 1 {
					start := time.Now()
					c2, err := collective.Init(ctx, opts[me])
					if err == nil {
						c2.Close()
						return fmt.Errorf("rank %d: a second Init succeeded", me)
					}
					var oe *collective.OpError
					if !errors.Is(err, collective.ErrInvalid) || !errors.As(err, &oe) || oe.Rank != me || !strings.Contains(err.Error(), "a communicator of this job is already open in this process") || !strings.Contains(err.Error(), "Close it first") {
						return fmt.Errorf("rank %d: second Init: %v, want ErrInvalid saying one is open", me, err)
					}
					if took := time.Since(start); took > c.Timeout()/2 {
						return fmt.Errorf("rank %d: the second Init took %v to fail", me, took)
					}
				}
				for it := range 2 {
					if err := checkGather(ctx, c, 3000+it, 10+it); err != nil {
						return err
					}
				}
				if again != "every" {
					return nil
				}
				// Under another name, a second communicator of the job is
				// fine beside the first.
				o := opts[me]
				o.Name = "second"
				c2, err := collective.Init(ctx, o)
				if err != nil {
					return fmt.Errorf("rank %d: Init under another name: %v", me, err)
				}
				defer c2.Close()
				if err := checkGather(ctx, c2, 5000, 20); err != nil {
					return err
				}
				return checkGather(ctx, c, 5000, 21)
			})
		})
	}
}

// TestInitAfterClose: Close, then Init again with the same options, as a
// framework that tears its process group down and makes it again does,
// gives a working communicator on every rank, round after round.
func TestInitAfterClose(t *testing.T) {
	opts := make([]collective.Options, 3)
	tune := func(o *collective.Options) { opts[o.Rank] = *o }
	inProcessNodes(t, 1, 3, tune, func(c *collective.Communicator) error {
		ctx := context.Background()
		me := c.Rank()
		if err := checkGather(ctx, c, 3000, 30); err != nil {
			return err
		}
		c.Close()
		for round := range 2 {
			c2, err := collective.Init(ctx, opts[me])
			if err != nil {
				return fmt.Errorf("rank %d: Init after Close, round %d: %v", me, round, err)
			}
			err = checkGather(ctx, c2, 3000+round, 31+round)
			c2.Close()
			if err != nil {
				return fmt.Errorf("round %d: %w", round, err)
			}
		}
		return nil
	})
}

// TestInitTimeoutWithDeadline: Options.Timeout bounds Init's waits also
// when the context has a later deadline (as it bounds every operation's):
// a rank that never joins fails Init at the Timeout, naming it.
func TestInitTimeoutWithDeadline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	o := collective.Options{Job: collective.Job{Rank: 0, WorldSize: 2, LocalWorldSize: 2, MasterAddr: "127.0.0.1",
		MasterPort: freePort(t), RunID: "tmo", JobSecret: []byte("s")}, Timeout: time.Second}
	t0 := time.Now()
	c, err := collective.Init(ctx, o)
	if err == nil {
		c.Close()
		t.Fatal("Init of a world of 2 succeeded with one rank")
	}
	if took := time.Since(t0); !errors.Is(err, collective.ErrTimeout) || took > 10*time.Second || !strings.Contains(err.Error(), "1") {
		t.Fatalf("Init with rank 1 missing: %v after %v, want ErrTimeout naming rank 1 at the 1 s Timeout", err, took.Round(time.Millisecond))
	}
}

// TestInitAfterFailedInit: after a Close, one rank's Init fails on a bad
// option (before it reaches the store) and the other's fails waiting for
// it; then both Init again and meet: a failed Init counts as a
// generation on every rank alike, however it failed.
func TestInitAfterFailedInit(t *testing.T) {
	opts := make([]collective.Options, 2)
	tune := func(o *collective.Options) { opts[o.Rank] = *o }
	failed := make(chan struct{}) // rank 0's Init has failed
	inProcessNodes(t, 1, 2, tune, func(c *collective.Communicator) error {
		ctx := context.Background()
		me := c.Rank()
		c.Close()
		o := opts[me]
		o.Timeout = time.Second
		if me == 1 {
			o.Algo = "bogus"
		}
		if c2, err := collective.Init(ctx, o); err == nil {
			c2.Close()
			return fmt.Errorf("rank %d: Init with rank 1's bad option succeeded", me)
		}
		if me == 0 {
			close(failed)
		} else {
			<-failed
		}
		c2, err := collective.Init(ctx, opts[me])
		if err != nil {
			return fmt.Errorf("rank %d: Init again after the failed one: %v", me, err)
		}
		defer c2.Close()
		return checkGather(ctx, c2, 700, 40)
	})
}
