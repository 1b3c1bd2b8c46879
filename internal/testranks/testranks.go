// Package testranks runs several ranks of a job inside one test process,
// one goroutine each, through the public collective API: the ranks of a
// node share memory, nodes talk TCP over loopback.
package testranks

import (
	"context"
	"testing"
	"time"

	"github.com/slimego/slimego/collective"
)

// Run runs nodes × perNode ranks in this process (collective.RunInProcess)
// with a 20-second communicator timeout, calls tune (if not nil) on each
// rank's options, runs body on each, and reports every rank's error.
func Run(t *testing.T, nodes, perNode int, tune func(*collective.Options), body func(c *collective.Communicator) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := collective.RunInProcess(ctx, nodes, perNode, func(o *collective.Options) {
		o.Timeout = 20 * time.Second
		if tune != nil {
			tune(o)
		}
	}, body)
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// AllocsPerRun runs fn Runs times on every rank; rank 0 measures
// (testing.AllocsPerRun runs once more than asked, to warm up) while the
// others keep it company, and returns the process-wide allocations per
// run: an allocation on any rank shows. Other ranks return 0.
func AllocsPerRun(c *collective.Communicator, fn func() error) (float64, error) {
	if c.Rank() != 0 {
		for range Runs {
			if err := fn(); err != nil {
				return 0, err
			}
		}
		return 0, nil
	}
	var runErr error
	allocs := testing.AllocsPerRun(Runs-1, func() {
		if err := fn(); err != nil && runErr == nil {
			runErr = err
		}
	})
	return allocs, runErr
}

// Runs is how often AllocsPerRun runs fn: long enough that the runtime's
// own one-time allocations (a garbage collection starting its workers)
// average out below one per run.
const Runs = 201
