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
