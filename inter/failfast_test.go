package inter

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestFailedRunReturnsPromptly: one peer of rank 0 is gone before the
// call (its connection closed: ErrPeerLost at once), another is alive but
// enters the call 4 s late: for the hierarchical all-gather two rail
// peers, either one waited for first; for the ring its predecessor (a
// receive fails) and its successor (a send fails: more than the sockets'
// buffers hold), each in turn the one gone. Rank 0 knows at once that the
// call failed, and its Run says so at once, naming the peer gone: the
// link is interrupted rather than left to wait for the late peer
// (TestHierFailedRunLeavesDstAlone: nor does it leave the late peer's
// bytes to land in dst after it returned).
func TestFailedRunReturnsPromptly(t *testing.T) {
	const p = 3
	rail := RailPeers(p, 1, 0)
	next, prev, _ := Ring(p, 0)
	for _, tc := range []struct {
		name       string
		ring       bool
		n          int
		dead, late int
	}{
		{"hier", false, 4 << 20, rail[0], rail[1]},
		{"hier/late-first", false, 4 << 20, rail[1], rail[0]},
		{"ring", true, 32 << 20, prev, next},
		{"ring/successor-gone", true, 32 << 20, next, prev},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var took time.Duration
			var runErr error
			gone := make(chan struct{})
			cluster(t, p, 1, tc.ring, func(rank int, ag allGatherer) error {
				if rank == tc.dead {
					ag.closeLinks()
					close(gone)
					return nil
				}
				n := tc.n
				dst := make([]byte, p*n)
				src := bytes.Repeat([]byte{byte(rank + 1)}, n)
				sizes, offs := []int{n, n, n}, []int{0, n, 2 * n}
				switch rank {
				case tc.late:
					time.Sleep(4 * time.Second)
					ag.run(context.Background(), "allgather", dst, src, sizes, offs)
					return nil
				}
				<-gone // gone before the call: the clock starts once its sockets are closed
				start := time.Now()
				runErr = ag.run(context.Background(), "allgather", dst, src, sizes, offs)
				took = time.Since(start)
				return nil
			})
			t.Logf("rank 0 after %v: %v", took, runErr)
			if runErr == nil {
				t.Fatalf("rank 0's Run succeeded without rank %d", tc.dead)
			}
			if want := fmt.Sprintf("rank %d", tc.dead); !strings.Contains(runErr.Error(), want) {
				t.Errorf("rank 0's error does not name %s, the peer gone", want)
			}
			if took > 2*time.Second {
				t.Errorf("rank 0's Run returned its error (rank %d lost) after %v: it waited for rank %d", tc.dead, took, tc.late)
			}
		})
	}
}
