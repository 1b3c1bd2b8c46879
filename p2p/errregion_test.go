package p2p

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestMisuseErrorsNameRegions: the errors of a careless call name the
// regions concerned. A transfer started on a region this side has
// deregistered names the peer's region in OpError.Region, as every other
// error of a transfer does (docs/P2P.md: one failed by this side's
// Deregister names this side's region in the cause), and this side's in
// the text; a region of another endpoint, given to Deregister or as an
// operation's local region, is named with its endpoint.
func TestMisuseErrorsNameRegions(t *testing.T) {
	a, b, ab, _ := pair(t, nil)
	ctx := ctxT(t, 20*time.Second)
	lr, _ := a.Register("src", make([]byte, 100))
	tr, _ := b.Register("dst", make([]byte, 100))
	other, _ := b.Register("theirs", make([]byte, 100))
	if err := a.Deregister(ctx, lr); err != nil {
		t.Fatal(err)
	}
	err := ab.Write([]Op{{Local: lr, Remote: tr.Remote(), Len: 2}}).Wait(ctx)
	var oe *OpError
	if !errors.Is(err, ErrClosed) || !errors.As(err, &oe) || oe.Region != `"dst"` || !strings.Contains(oe.Err.Error(), `"src"`) {
		t.Errorf("a write from a deregistered region: %v; want ErrClosed, Region \"dst\" (the peer's), the cause naming \"src\"", err)
	}
	err = a.Deregister(ctx, other)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `"theirs"`) || !strings.Contains(err.Error(), `endpoint "b"`) {
		t.Errorf("Deregister of another endpoint's region: %v; want ErrInvalid naming region \"theirs\" and endpoint \"b\"", err)
	}
	err = ab.Write([]Op{{Local: other, Remote: tr.Remote(), Len: 2}}).Wait(ctx)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `"theirs"`) || !strings.Contains(err.Error(), `endpoint "b"`) {
		t.Errorf("a write from another endpoint's region: %v; want ErrInvalid naming region \"theirs\" and endpoint \"b\"", err)
	}
}
