package launcher

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/testbin"
	"github.com/slimego/slimego/rendezvous"
)

// TestPlacementFailureAfterBarrierEndsJob: node 1 cannot use node 0's
// placement record (a slimerun of another version, or a record rewritten
// by whoever holds the secret), which it reads after the nodes' barrier,
// when node 0 is already starting its workers. Node 1 must tell the
// others, as a node whose worker could not start does: node 0 ends at
// once naming node 1, rather than running its workers as if the job were
// whole until they time out waiting for node 1's ranks; with restarts
// allowed too (a node that cannot start its workers is no worker's
// failure: a restart would wait for workers that node never starts).
func TestPlacementFailureAfterBarrierEndsJob(t *testing.T) {
	for _, restarts := range []int{0, 1} {
		t.Run(fmt.Sprintf("restarts=%d", restarts), func(t *testing.T) { placementFailure(t, restarts) })
	}
}

func placementFailure(t *testing.T, restarts int) {
	cpus, err := allowedCPUs()
	if err != nil || len(cpus) < 1 {
		t.Skip("no CPU list")
	}
	port := testbin.FreePort(t)
	runID := fmt.Sprintf("placefail%d", restarts)
	secret := []byte("s")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var outs [2]syncBuffer
	cfg := func(node int) Config {
		return Config{NNodes: 2, NodeRank: node, NProcPerNode: 1, MasterAddr: "127.0.0.1", MasterPort: port, RunID: runID,
			RdzvTimeout: 30 * time.Second, StopGrace: time.Second, BindToCore: true, JobSecret: secret, MaxRestarts: restarts,
			Env: []string{"PATH=" + os.Getenv("PATH")}, Program: "sh",
			// A worker that stands for one waiting in Init for node 1's ranks.
			Args:   []string{"-c", "sleep 25"},
			Stdout: &outs[node], Stderr: &outs[node]}
	}
	ch0 := make(chan error, 1)
	go func() { ch0 <- Run(ctx, cfg(0)) }()
	st, err := rendezvous.Dial(ctx, "127.0.0.1:"+strconv.Itoa(port), rendezvous.Auth{Secret: secret, Job: runID})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Get(ctx, placeKey(runID, 0)); err != nil {
		t.Fatal(err)
	}
	if err := st.Set(ctx, placeKey(runID, 0), []byte("v2:host=x;cpus=0-3")); err != nil {
		t.Fatal(err)
	}
	st.Close() // node 0's store would wait for it at the end
	begin := time.Now()
	ch1 := make(chan error, 1)
	go func() { ch1 <- Run(ctx, cfg(1)) }()
	err1 := result(ch1, "node 1")
	err0 := result(ch0, "node 0")
	took := time.Since(begin)
	if err1 == nil || !strings.Contains(err1.Error(), "bad placement") {
		t.Errorf("node 1: %v; want its bad placement named", err1)
	}
	if err0 == nil || took > 5*time.Second || !strings.Contains(err0.Error(), "node 1") {
		t.Fatalf("node 0 ended %v after node 1 started, with %v; want an error naming node 1 at once\n%s", took, err0, outs[0].String())
	}
	t.Logf("node 0 after %v: %v", took.Round(time.Millisecond), err0)
}
