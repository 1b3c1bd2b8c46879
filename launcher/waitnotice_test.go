package launcher

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/testbin"
)

// TestRendezvousWaitNoticed: a node waiting in the rendezvous says so
// while it waits, naming whom it waits for, and again later; the wait
// lasts up to --rdzv-timeout (5 minutes by default), and said nothing
// until it ended. Node 1 waits for a store nobody started; node 0 for a
// node 1 that never comes.
func TestRendezvousWaitNoticed(t *testing.T) {
	saved, savedEvery := noticeAfter, noticeEvery
	noticeAfter, noticeEvery = 300*time.Millisecond, 500*time.Millisecond
	defer func() { noticeAfter, noticeEvery = saved, savedEvery }()
	for _, tc := range []struct {
		node int
		want string
	}{
		{1, "node 1: still waiting for node 0's store at 127.0.0.1:%d (is node 0's slimerun running"},
		{0, "node 0: still waiting for the other 1 node(s) to join at the store 127.0.0.1:%d"},
	} {
		t.Run("node"+strconv.Itoa(tc.node), func(t *testing.T) {
			port := testbin.FreePort(t)
			var mu sync.Mutex
			var logs []string
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := Run(ctx, Config{NNodes: 2, NodeRank: tc.node, NProcPerNode: 1, MasterAddr: "127.0.0.1", MasterPort: port,
				RunID: "notice" + strconv.Itoa(port), JobSecret: []byte("s"), RdzvTimeout: 1500 * time.Millisecond, Program: "true",
				Logf: func(f string, a ...any) {
					mu.Lock()
					logs = append(logs, fmt.Sprintf(f, a...))
					mu.Unlock()
				}})
			if err == nil {
				t.Fatal("the rendezvous of one node of two succeeded")
			}
			mu.Lock()
			defer mu.Unlock()
			want := fmt.Sprintf(tc.want, port)
			n := 0
			for _, l := range logs {
				if strings.Contains(l, want) {
					n++
				}
			}
			if n < 2 {
				t.Fatalf("%d notices %q (want 2 or more) in:\n%s", n, want, strings.Join(logs, "\n"))
			}
		})
	}
}
