package collective

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/rendezvous"
)

// TestInitAbortNamesTheExitedRank: a rank waiting in Init for a rank that
// has not published yet (rank 0's knobs, then each rank's layout) when
// the launcher aborts the attempt because another rank (1) exited names
// rank 1 and what it was waiting for, and does not say that the rank it
// waited for never joined: that rank is alive, and its own Init fails
// naming rank 1 too.
func TestInitAbortNamesTheExitedRank(t *testing.T) {
	for _, tc := range []struct {
		name      string
		published []string // keys of the world set before the abort
	}{
		{"waiting for rank 0's knobs", nil},
		{"waiting for the layouts", []string{"knobs/0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, srv, st, runID, secret := launcherStore(t, "wf")
			key := rendezvous.AttemptPrefix(runID, 0) + "world/"
			done := make(chan error, 1)
			go func() {
				c, err := Init(ctx, Options{Job: Job{
					Rank: 2, WorldSize: 3, LocalRank: 2, LocalWorldSize: 3, NodeRank: 0,
					MasterAddr: "127.0.0.1", MasterPort: srv.Port(), AgentStore: true, RunID: runID, JobSecret: secret,
				}, Timeout: 10 * time.Second})
				if err == nil {
					c.Close()
				}
				done <- err
			}()
			if _, err := st.Get(ctx, key+"layout/2"); err != nil { // rank 2 has published
				t.Fatal(err)
			}
			for _, k := range tc.published {
				v, err := st.Get(ctx, key+"knobs/2")
				if err != nil {
					t.Fatal(err)
				}
				if err := st.Set(ctx, key+k, v); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(100 * time.Millisecond) // rank 2 waits
			reason := "rank 1 (pid 4242) exited with code 0"
			if err := st.Abort(ctx, rendezvous.AttemptPrefix(runID, 0), 1, reason); err != nil {
				t.Fatal(err)
			}
			err := <-done
			var oe *fault.OpError
			if !errors.Is(err, ErrPeerLost) || !errors.As(err, &oe) || oe.Peer != 1 || !strings.Contains(err.Error(), reason) {
				t.Fatalf("rank 2's Init: %v, want ErrPeerLost naming rank 1 and why", err)
			}
			if strings.Contains(err.Error(), "never joined") {
				t.Fatalf("rank 2's Init: %v: says a rank never joined, where rank 1 exited", err)
			}
			t.Logf("%v", err)
		})
	}
}
