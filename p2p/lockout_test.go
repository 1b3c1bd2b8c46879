package p2p

import (
	"testing"
	"time"

	"github.com/slimego/slimego/internal/testflood"
)

// TestSilentFloodDoesNotLockOutMembers: connections that never prove
// anything (anyone who reaches the port can open them) must not keep a
// member from linking for as long as the flood goes on, as the store's and
// the transport's listeners make sure by evicting the oldest silent one.
func TestSilentFloodDoesNotLockOutMembers(t *testing.T) {
	setLimit(t, &maxHandshakes, 8) // the same with 4096: the flood needs twice as many
	_, st := storeFor(t)
	ctx := ctxT(t, 30*time.Second)
	a := published(t, ctx, st, "a", nil)
	b := published(t, ctx, st, "b", nil)
	stop := testflood.Silent(a.Addr(), 3*maxHandshakes) // always more than the slots
	defer stop()
	time.Sleep(time.Second) // the flood is on
	t0 := time.Now()
	_, err := b.Connect(ctxT(t, 20*time.Second), "a")
	t.Logf("Connect took %v", time.Since(t0).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("a member cannot link while unproven connections flood the port (after %v): %v", time.Since(t0).Round(time.Millisecond), err)
	}
}
