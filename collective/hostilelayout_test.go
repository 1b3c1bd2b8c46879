package collective

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/rendezvous"
)

// TestOwnLayoutEntryRewritten: a member gone bad (here playing rank 0)
// rewrites rank 1's layout entry in the store after rank 1 published it,
// consistently with its own (two nodes of one rank each, and the same
// knobs as rank 1's), so that the layout alone holds together. Rank 1
// must not take it: the layout it builds from the store would put it alone
// on a node while its options say it is local rank 1 of 2 (an intra group
// of two ranks whose global ranks list one, indexed past its end). Its
// Init fails with ErrInvalid, saying its own entry is not what it
// published.
func TestOwnLayoutEntryRewritten(t *testing.T) {
	ctx, srv, st, runID, secret := launcherStore(t, "hl")
	done := make(chan error, 1)
	go func() {
		c, err := Init(ctx, Options{Job: Job{
			Rank: 1, WorldSize: 2, LocalRank: 1, LocalWorldSize: 2, NodeRank: 0,
			MasterAddr: "127.0.0.1", MasterPort: srv.Port(), AgentStore: true, RunID: runID, JobSecret: secret,
		}, Timeout: 5 * time.Second})
		if err == nil {
			c.Close()
		}
		done <- err
	}()
	key := rendezvous.AttemptPrefix(runID, 0) + "world/"
	if _, err := st.Get(ctx, key+"layout/1"); err != nil {
		t.Fatal(err)
	}
	knobs, err := st.Get(ctx, key+"knobs/1") // published before the layout
	if err != nil {
		t.Fatal(err)
	}
	// In this order: rank 1's entry rewritten before it can read rank 0's
	// (which it waits for), so that it reads the rewritten one.
	for _, kv := range [][2]string{{"layout/1", "1 0 1 -"}, {"knobs/0", string(knobs)}, {"layout/0", "0 0 1 -"}} {
		if err := st.Set(ctx, key+kv[0], []byte(kv[1])); err != nil {
			t.Fatal(err)
		}
	}
	bctx, bcancel := context.WithTimeout(ctx, 3*time.Second)
	st.Barrier(bctx, key+"layout-read", 0, 2)
	bcancel()
	err = <-done
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "this rank's layout entry in the store is") {
		t.Fatalf("rank 1's Init: %v, want ErrInvalid saying its own entry was rewritten", err)
	}
	t.Logf("%v", err)
}

// launcherStore is a store as a launcher serves it for a job of a fresh
// run id (prefix, pid and time) and secret, and a client of it, for a
// test playing the launcher and the other ranks; closed, with ctx (30 s),
// when the test ends.
func launcherStore(t *testing.T, prefix string) (ctx context.Context, srv *rendezvous.Server, st *rendezvous.Client, runID string, secret []byte) {
	t.Helper()
	runID = fmt.Sprintf("%s%d-%d", prefix, os.Getpid(), time.Now().UnixNano())
	secret = make([]byte, 32)
	rand.Read(secret)
	auth := rendezvous.Auth{Secret: secret, Job: runID}
	srv, err := rendezvous.Listen("127.0.0.1:0", rendezvous.ServerConfig{Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	if st, err = rendezvous.Dial(ctx, srv.Addr().String(), auth); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return ctx, srv, st, runID, secret
}
