package p2p

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestCloseDuringGrantCopy: an initiator closes while it copies through a
// grant (the first transfer to a region on one host goes by grant). Its
// Close stops the copy and must send the grant's release before its links
// end: the target, whose peer process still runs, cannot tell a lost
// release from a copy still going, and would hold the region until the
// heartbeat gave up on it.
func TestCloseDuringGrantCopy(t *testing.T) {
	const hb = 6 * time.Second
	const size = 256 << 20
	a, b, ab, _ := pair(t, func(o *Options) { o.Heartbeat = hb })
	ctx := ctxT(t, 30*time.Second)
	rb, _ := b.Register("big", make([]byte, size))
	ra, _ := a.Register("dst", make([]byte, size))
	f := ab.Read([]Op{{Local: ra, Remote: rb.Remote(), Len: size}})
	eventually(t, "the grant copy to start", func() bool {
		return ab.l.grantCopies.Load() > 0
	})
	if err := a.Close(); err != nil {
		t.Fatalf("the initiator's Close: %v", err)
	}
	err := f.Wait(ctx)
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("a read cut by Close: %v, want ErrClosed", err)
	}
	// The error names the transfer's region (the peer's, as every other
	// error of a transfer does) and says this side closed.
	if s := err.Error(); !strings.Contains(s, `region "big"`) || !strings.Contains(s, `region "dst" was withdrawn by Close`) {
		t.Fatalf("a read cut by Close: %q, want it to name region \"big\" and say \"dst\" was withdrawn by Close", s)
	}
	if tr := f.Transport(); tr != "cma" {
		t.Fatalf("the read went by %q, want cma (a grant)", tr)
	}
	t0 := time.Now()
	if err := b.Deregister(ctx, rb); err != nil {
		t.Fatalf("the target's Deregister: %v", err)
	}
	if d := time.Since(t0); d > hb/3 {
		t.Fatalf("the target's Deregister took %v (heartbeat %v): the initiator's Close did not release its grant", d, hb)
	}
}
