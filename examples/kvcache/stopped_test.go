package main

import (
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/testbin"
)

// TestKVCachePrefillStopped: prefill rank 0 is stopped (SIGSTOP: a slow
// peer, alive but silent) in the middle of the rounds, with --timeout 3s.
// The decode rank must say why it fails, naming the lost rank, within
// the timeout and a little: not first wait for its endpoint's Close, which
// waits up to heartbeats (5 s each) for a silent peer to give back its
// leases of the cache.
func TestKVCachePrefillStopped(t *testing.T) {
	dir := build(t)
	const timeout = 3 * time.Second
	cmd := exec.Command(filepath.Join(dir, "slimerun"), "--standalone", "--nproc-per-node", "2", "--stop-grace", "1",
		filepath.Join(dir, "kvcache"), "--pages", "256", "--batch", "16", "--rounds", "1000000", "--timeout", timeout.String())
	testbin.Stopped{Cmd: cmd, Exe: filepath.Join(dir, "kvcache"), Rank: 0, After: time.Second, Timeout: timeout,
		Prefix: "[1]: kvcache: rank 1: ", Names: []string{"rank0", "[0]", "rank 0"}, Patience: 20 * time.Second}.Run(t)
}
