package inter

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// TestHierFailedRunReturnsPromptly: rank 0's rail peer is gone before the
// call (its connection closed: ErrPeerLost at once); another rail peer is
// alive but enters the call 4 s late. Rank 0 knows at once that the call
// failed, and its Run says so at once: it interrupts its link rather than
// wait for the late peer's bytes (TestHierFailedRunLeavesDstAlone: nor
// does it leave them to land in dst after it returned).
func TestHierFailedRunReturnsPromptly(t *testing.T) {
	const nodes, n = 3, 4 << 20
	peers := RailPeers(nodes, 1, 0)
	dead, late := peers[0], peers[1]
	var took time.Duration
	cluster(t, nodes, 1, false, func(rank int, ag allGatherer) error {
		dst := make([]byte, nodes*n)
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
		err := ag.run(context.Background(), "allgather", dst, src, sizes, offs)
		took = time.Since(start)
		t.Logf("rank 0 after %v: %v", took, err)
		return nil
	})
	if took > 2*time.Second {
		t.Errorf("rank 0's Run returned its error (peer %d lost) after %v: it waited for peer %d", dead, took, late)
	}
}
