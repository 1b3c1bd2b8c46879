package main

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestRemoteFailureSaidOnce: a node whose workers another node's failure
// stops says what failed once, in its final error, not also in its
// progress line (which says it stops its workers, and on whose report).
func TestRemoteFailureSaidOnce(t *testing.T) {
	port := freePortString(t)
	var outs [2]*os.File
	var dones [2]chan error
	for n, prog := range [][]string{{"sleep", "30"}, {"sh", "-c", "sleep 0.5; exit 3"}} {
		_, outs[n], dones[n] = startSlimerun(t, "remote-once", append([]string{"--nnodes", "2", "--node-rank", strconv.Itoa(n), "--nproc-per-node", "1",
			"--master-addr", "127.0.0.1", "--master-port", port, "--stop-grace", "1s"}, prog...)...)
	}
	for n := range 2 {
		if _, ok := exited(dones[n], 30*time.Second); !ok {
			t.Fatalf("node %d still runs:\n%s", n, text(outs[n]))
		}
	}
	s := text(outs[0])
	if c := strings.Count(s, "exited with code 3"); c != 1 {
		t.Errorf("node 0 says rank 1's exit %d times, want once:\n%s", c, s)
	}
	if !strings.Contains(s, "stopping this node's workers: node 1 reported a failure") {
		t.Errorf("node 0 does not say why it stops its workers:\n%s", s)
	}
}
