package launcher

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/rendezvous"
)

// TestStoreLostDuringRendezvous: node 0's store goes away (its launcher
// killed) while node 1 waits at the node barrier for a third node. Node 1
// fails at once saying that node 0's store was lost, not that an empty
// list of nodes "did not join" within the rendezvous timeout.
func TestStoreLostDuringRendezvous(t *testing.T) {
	runID := "storelost-" + strconv.Itoa(os.Getpid())
	cfg := Config{RunID: runID, JobSecret: []byte("nodes-secret")}
	srv, err := rendezvous.Listen("127.0.0.1:0", rendezvous.ServerConfig{Auth: cfg.auth()})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	// What node 0's launcher publishes before it joins the barrier.
	srv.Set(PortKey(runID), []byte("12345"))
	srv.Set(claimKey(runID, 0), nodeInfo{NNodes: 3, NProcPerNode: 1, Host: "node0", Pid: 1}.encode())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out syncBuffer
	ch := make(chan error, 1)
	go func() {
		ch <- Run(ctx, Config{NNodes: 3, NodeRank: 1, NProcPerNode: 1, MasterAddr: "127.0.0.1", MasterPort: srv.Port(),
			RunID: runID, JobSecret: []byte("nodes-secret"), RdzvTimeout: 30 * time.Second, StopGrace: time.Second,
			Program: "true", Stdout: &out, Stderr: &out})
	}()
	for {
		if _, ok := srv.Lookup(rendezvous.BarrierKey(nodesBarrier(runID), 1)); ok {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("node 1 never reached the barrier")
		}
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	srv.Close()
	err = result(ch, "node 1")
	took := time.Since(start)
	t.Logf("node 1 (%v after the store closed): %v", took.Round(time.Millisecond), err)
	if err == nil || strings.Contains(err.Error(), "did not join") || !strings.Contains(err.Error(), "node 0's store") {
		t.Errorf("node 1: %v; want it to say node 0's store was lost", err)
	}
	if took > 15*time.Second {
		t.Errorf("node 1 took %v", took)
	}
}
