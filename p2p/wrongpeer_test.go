package p2p

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestMisuseInfoAddressOfAnotherEndpoint: an Info whose address is now
// another endpoint's (an Info left by a closed endpoint whose port a later
// endpoint of the job got, or one mixed up out of band) must not link
// this side, under the Info's name, to that other endpoint: the acceptor
// does not say who it is, so the link is made, and a Send to "x" lands in
// "y"'s Recv from "a". The hello's answer carries a tag of the
// acceptor's name: Connect fails with ErrRefused saying so.
func TestMisuseInfoAddressOfAnotherEndpoint(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	a := endpoint(t, ctx, Options{Name: "a", Auth: testAuth()})
	x := endpoint(t, ctx, Options{Name: "x", Auth: testAuth()})
	y := endpoint(t, ctx, Options{Name: "y", Auth: testAuth()})
	in, err := decodeInfo(x.Info())
	if err != nil {
		t.Fatal(err)
	}
	x.Close()
	in.addr = y.Addr() // x's Info, its port now y's
	p, err := a.ConnectInfo(ctx, in.encode())
	if err != nil {
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), `another endpoint's than "x"`) {
			t.Errorf("ConnectInfo to x's Info holding y's address: %v, want ErrRefused saying another endpoint listens there", err)
		}
		if y.Peer("a") != nil {
			t.Errorf("y linked to a")
		}
		return
	}
	f := p.Send([]byte("for x"))
	if py := y.Peer("a"); py != nil {
		buf := make([]byte, 8)
		if err := py.Recv(buf).Wait(ctxT(t, 2*time.Second)); err == nil {
			t.Errorf("a's link to \"x\" is y's: a Send to x was received by y: %q", buf[:5])
		}
	}
	f.Wait(ctxT(t, time.Second))
	t.Errorf("ConnectInfo with x's Info holding y's address linked to %q as %q", y.Name(), p.Name())
}
