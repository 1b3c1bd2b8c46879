package collective

import (
	"context"
	"crypto/rand"
	"fmt"
	"math"
	"os"
	"sync"
	"time"

	"github.com/slimego/slimego/rendezvous"
)

// RunInProcess runs nodes × perNode ranks of one job as goroutines of this
// process, with a private rendezvous store on loopback: rank r is local
// rank r mod perNode of node r / perNode. tune, if not nil, adjusts each
// rank's Options before Init; body runs on each rank's communicator, which
// is closed after it. It returns every rank's error (nil where it
// succeeded). On a GPU the ranks share one CUDA context, so their kernels
// run side by side. A job of fewer than one node or one rank per node,
// or of more than 2^31-1 ranks, is refused: the one error returned is ErrInvalid, and body does not run.
func RunInProcess(ctx context.Context, nodes, perNode int, tune func(*Options), body func(*Communicator) error) []error {
	if nodes < 1 || perNode < 1 || perNode > math.MaxInt32/nodes {
		return []error{fmt.Errorf("collective: RunInProcess of %d nodes of %d ranks each: %w", nodes, perNode, ErrInvalid)}
	}
	P := nodes * perNode
	errs := make([]error, P)
	runID := fmt.Sprintf("inproc%d-%d", os.Getpid(), time.Now().UnixNano()) // shared-memory names: unique across processes too
	secret := make([]byte, 32)
	rand.Read(secret)
	srv, err := rendezvous.Listen("127.0.0.1:0", rendezvous.ServerConfig{Auth: rendezvous.Auth{Secret: secret, Job: runID}})
	if err != nil {
		for r := range errs {
			errs[r] = err
		}
		return errs
	}
	defer srv.Close()
	var wg sync.WaitGroup
	for r := range P {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := Options{Job: Job{
				Rank: r, WorldSize: P, LocalRank: r % perNode, LocalWorldSize: perNode, NodeRank: r / perNode,
				MasterAddr: "127.0.0.1", MasterPort: srv.Port(), AgentStore: true, RunID: runID, JobSecret: secret,
			}}
			if tune != nil {
				tune(&o)
			}
			c, err := Init(ctx, o)
			if err != nil {
				errs[r] = err
				return
			}
			defer c.Close()
			errs[r] = body(c)
		}()
	}
	wg.Wait()
	return errs
}
