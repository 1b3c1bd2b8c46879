// Package testranks runs several ranks of a job inside one test process,
// one goroutine each, through the public collective API: the ranks of a
// node share memory, nodes talk TCP over loopback.
package testranks

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/rendezvous"
)

// Run starts a store and nodes × perNode ranks, calls tune (if not nil) on
// each rank's options, runs body on each, and reports every rank's error.
func Run(t *testing.T, nodes, perNode int, tune func(*collective.Options), body func(c *collective.Communicator) error) {
	t.Helper()
	P := nodes * perNode
	srv, err := rendezvous.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	runID := fmt.Sprintf("inproc%d", time.Now().UnixNano())
	var wg sync.WaitGroup
	errs := make([]error, P)
	for r := range P {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := collective.Options{
				Rank: r, WorldSize: P, LocalRank: r % perNode, LocalWorldSize: perNode, NodeRank: r / perNode,
				MasterAddr: "127.0.0.1", MasterPort: srv.Port(), AgentStore: true,
				RunID: runID, Timeout: 20 * time.Second,
			}
			if tune != nil {
				tune(&o)
			}
			c, err := collective.Init(ctx, o)
			if err != nil {
				errs[r] = err
				return
			}
			defer c.Close()
			errs[r] = body(c)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}
