package inter

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// TestRingFailedRunReturnsPromptly: rank 0's ring predecessor is gone
// before the call (its connection closed: ErrPeerLost at once), and its
// successor is alive but enters the call 4 s late. Rank 0 knows at once
// that the call failed, and its Run says so at once: it interrupts its
// link rather than wait for the successor to take its block (a send
// larger than the sockets' buffers).
func TestRingFailedRunReturnsPromptly(t *testing.T) {
	const p, n = 3, 32 << 20
	late, dead, _ := Ring(p, 0) // next, prev
	var took time.Duration
	var runErr error
	cluster(t, p, 1, true, func(rank int, ag allGatherer) error {
		dst := make([]byte, p*n)
		src := bytes.Repeat([]byte{byte(rank + 1)}, n)
		sizes, offs := []int{n, n, n}, []int{0, n, 2 * n}
		switch rank {
		case dead:
			return nil
		case late:
			time.Sleep(4 * time.Second)
			ag.run(context.Background(), "allgather", dst, src, sizes, offs)
			return nil
		}
		start := time.Now()
		runErr = ag.run(context.Background(), "allgather", dst, src, sizes, offs)
		took = time.Since(start)
		return nil
	})
	t.Logf("rank 0 after %v: %v", took, runErr)
	if runErr == nil {
		t.Fatalf("rank 0's Run succeeded without its predecessor (rank %d)", dead)
	}
	if took > 2*time.Second {
		t.Errorf("rank 0's Run returned its error (rank %d lost) after %v: it waited for rank %d", dead, took, late)
	}
}
