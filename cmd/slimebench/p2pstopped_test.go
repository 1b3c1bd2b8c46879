package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/testbin"
)

// TestP2PPeerStopped: rank 1 of slimebench p2p is stopped (SIGSTOP: a
// slow peer, alive but silent) during the timed rounds, with
// SLIME_TIMEOUT=3s. Rank 0 must say why it fails, naming rank 1, within
// the timeout and a little: not first wait for its endpoint's Close, which
// waits up to heartbeats (5 s each) for a silent peer's leases.
func TestP2PPeerStopped(t *testing.T) {
	dir, err := testbin.Build()
	if err != nil {
		t.Fatal(err)
	}
	const timeout = 3 * time.Second
	cmd := exec.Command(filepath.Join(dir, "slimerun"), "--standalone", "--nproc-per-node", "2", "--stop-grace", "1",
		filepath.Join(dir, "slimebench"), "p2p", "--op", "read", "--batch", "1", "--concurrency", "1", "--register", "0",
		"--no-baselines", "--min-time", "60s")
	cmd.Env = append(os.Environ(), "SLIME_TIMEOUT="+timeout.String())
	testbin.Stopped{Cmd: cmd, Exe: filepath.Join(dir, "slimebench"), Rank: 1, After: 2 * time.Second, Timeout: timeout,
		Prefix: "[0]: slimebench: ", Names: []string{"rank1", "rank 1"}, Patience: 30 * time.Second}.Run(t)
}
