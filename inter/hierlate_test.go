package inter

import (
	"bytes"
	"context"
	"strconv"
	"testing"
	"time"
)

// TestHierFailedRunLeavesDstAlone: when a hierarchical all-gather fails
// on one peer (lost), Run collects the receives it posted from the other
// peers before it returns its error: otherwise their connection
// goroutines would go on writing into the caller's dst after Run
// returned, and a caller that reuses dst once the call has failed (the
// communicator is broken; the memory is the caller's again) would see it
// change under it. Here a late peer's block lands 500 ms after the
// failure.
func TestHierFailedRunLeavesDstAlone(t *testing.T) {
	const nodes, n = 3, 4 << 20 // well above DirectMax: the goroutines receive
	peers := RailPeers(nodes, 1, 0)
	dead, late := peers[0], peers[1]
	changed := make(chan string, 1)
	cluster(t, nodes, 1, false, func(rank int, ag allGatherer) error {
		dst := make([]byte, nodes*n)
		src := bytes.Repeat([]byte{byte(rank + 1)}, n)
		sizes := []int{n, n, n}
		offs := []int{0, n, 2 * n}
		ctx := context.Background()
		switch rank {
		case dead:
			return nil // gone before the call: its transport closes
		case late:
			time.Sleep(500 * time.Millisecond)
			ag.run(ctx, "allgather", dst, src, sizes, offs)
			time.Sleep(time.Second)
			return nil
		}
		err := ag.run(ctx, "allgather", dst, src, sizes, offs)
		if err == nil {
			t.Errorf("rank 0: the call succeeded with rank %d gone", dead)
			return nil
		}
		t.Logf("rank 0: %v", err)
		// The caller now reuses its buffer.
		for i := range dst {
			dst[i] = 0xEE
		}
		time.Sleep(1500 * time.Millisecond)
		for i, b := range dst {
			if b != 0xEE {
				changed <- "after Run returned its error, dst[" + strconv.Itoa(i) + "] (rank " + strconv.Itoa(late) + "'s block) was written by the transport"
				break
			}
		}
		return nil
	})
	select {
	case msg := <-changed:
		t.Fatal(msg)
	default:
	}
}
