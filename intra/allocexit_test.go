package intra

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/internal/teststore"
	"github.com/slimego/slimego/rendezvous"
)

// TestAllocPeerExited: a local rank in a process of its own is killed
// while the other rank's Alloc already waits in the store for its size
// (a second after both passed a barrier), where nobody (no launcher:
// srun, mpirun) aborts the wait. The Alloc must fail then with
// ErrPeerLost naming the rank, not wait out the group's timeout. (The
// waiting call holds the rank's store connection: the abort goes by
// another.)
func TestAllocPeerExited(t *testing.T) {
	if os.Getenv("INTRA_ALLOC_RANK") != "" {
		return // the killed rank's process runs TestAllocExitRank
	}
	addr := teststore.Serve(t, rendezvous.ServerConfig{})
	prefix := fmt.Sprintf("slimego-test-%d-allocexit-", os.Getpid())
	var out strings.Builder
	cmd := exec.Command(os.Args[0], "-test.run=^TestAllocExitRank$")
	cmd.Env = append(os.Environ(), "INTRA_ALLOC_RANK=1", "INTRA_ALLOC_STORE="+addr, "INTRA_ALLOC_PREFIX="+prefix)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := rendezvous.Dial(ctx, addr, rendezvous.Auth{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	g, err := New(ctx, Config{Store: st, Key: "a", ShmPrefix: prefix, Rank: 0, Size: 2, Timeout: 20 * time.Second})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	defer g.Close()
	if err := g.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = g.Alloc(context.Background(), 4096) // bounded by the group's timeout
	took := time.Since(start)
	t.Logf("Alloc, the peer killed 1 s after the barrier (%v): %v", took.Round(time.Millisecond), err)
	var oe *fault.OpError
	if !errors.Is(err, fault.ErrPeerLost) || !errors.As(err, &oe) || oe.Peer != 1 || took > 5*time.Second {
		t.Fatalf("Alloc with local rank 1 dead: %v after %v; want ErrPeerLost naming rank 1 at once (timeout 20 s)", err, took)
	}
}

// TestAllocExitRank is TestAllocPeerExited's rank 1, in a process of its
// own: it joins the group, passes a barrier, and is killed a second
// later.
func TestAllocExitRank(t *testing.T) {
	if os.Getenv("INTRA_ALLOC_RANK") == "" {
		t.Skip("a rank of TestAllocPeerExited")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := rendezvous.Dial(ctx, os.Getenv("INTRA_ALLOC_STORE"), rendezvous.Auth{})
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(ctx, Config{Store: st, Key: "a", ShmPrefix: os.Getenv("INTRA_ALLOC_PREFIX"), Rank: 1, Size: 2, Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // rank 0 waits in Alloc by now
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
}
