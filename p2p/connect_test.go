package p2p

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/auth"
)

// slowAcceptor proves itself and answers the hello after delay: a peer
// that is slow to link (a loaded machine), not a dead one.
func slowAcceptor(t *testing.T, delay time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
			go func() {
				k := auth.NewKey(testAuth().Secret, testAuth().Job)
				if auth.Accept(c, k, shakePurpose("slow", c.LocalAddr().String()), time.Now().Add(5*time.Second)) != nil {
					c.Close()
					return
				}
				time.Sleep(delay)
				answerHello(c, stOK)
			}()
		}
	}()
	return ln.Addr().String()
}

// TestConcurrentConnect: two Connects to one peer, one with a long
// deadline and one ended first by its own context (a short deadline, or
// its caller's cancel). Whichever dials (the first), the short one's end
// is its own: where it waits for the long one's link it ends alone, and
// where it is the dialer, the long one, which waits for its link, dials
// again and links.
func TestConcurrentConnect(t *testing.T) {
	for _, tc := range []struct {
		name  string
		short func(ctx context.Context) (context.Context, context.CancelFunc)
		want  error
	}{
		{"deadline", func(ctx context.Context) (context.Context, context.CancelFunc) {
			return context.WithTimeout(ctx, 200*time.Millisecond)
		}, ErrTimeout},
		{"cancel", func(ctx context.Context) (context.Context, context.CancelFunc) {
			cctx, cancel := context.WithCancel(ctx)
			time.AfterFunc(200*time.Millisecond, cancel)
			return cctx, cancel
		}, ErrCancelled},
	} {
		for _, shortDials := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/short dials %v", tc.name, shortDials), func(t *testing.T) {
				ctx := ctxT(t, 20*time.Second)
				a := endpoint(t, ctx, Options{Name: "a", Auth: testAuth(), Channels: 1})
				in := info{name: "slow", addr: slowAcceptor(t, 600*time.Millisecond)}
				long := func() (*Peer, error) {
					lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					defer cancel()
					return a.ConnectInfo(lctx, in.encode())
				}
				short := func() error {
					sctx, cancel := tc.short(ctx)
					defer cancel()
					_, err := a.ConnectInfo(sctx, in.encode())
					return err
				}
				var shortErr, longErr error
				var p *Peer
				first := make(chan struct{})
				go func() {
					defer close(first)
					if shortDials {
						shortErr = short()
					} else {
						p, longErr = long()
					}
				}()
				time.Sleep(100 * time.Millisecond) // the first is dialing
				if shortDials {
					p, longErr = long()
				} else {
					shortErr = short()
				}
				<-first
				if !errors.Is(shortErr, tc.want) {
					t.Errorf("the short Connect: %v, want %v", shortErr, tc.want)
				}
				if longErr != nil {
					t.Fatalf("a Connect with 10 s left failed because the other Connect's context ended: %v", longErr)
				}
				if p.Name() != "slow" {
					t.Fatalf("linked to %q", p.Name())
				}
			})
		}
	}
}

// TestConnectInfoOfAnotherName: Connect(name) takes the Info stored
// under name; an Info there that names another endpoint (a stale or
// tampered entry) is not that endpoint's: Connect must not return a
// link to another endpoint than the one it was asked for, nor replace
// that endpoint's region table with what the entry under name says.
func TestConnectInfoOfAnotherName(t *testing.T) {
	_, st := storeFor(t)
	ctx := ctxT(t, 20*time.Second)
	a := published(t, ctx, st, "a", nil)
	b := published(t, ctx, st, "b", nil)
	kv, _ := b.Register("kv", make([]byte, 4096))
	scratch, _ := b.Register("scratch", make([]byte, 4096))
	if err := b.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	ab, err := a.Connect(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	// Under "x": b's Info with its regions' names swapped.
	in, _ := decodeInfo(b.Info())
	for i := range in.regions {
		switch in.regions[i].Name {
		case "kv":
			in.regions[i].Name = "scratch"
		case "scratch":
			in.regions[i].Name = "kv"
		}
	}
	if err := st.Set(ctx, "p2p/info/x", in.encode()); err != nil {
		t.Fatal(err)
	}
	p, err := a.Connect(ctx, "x")
	if err == nil && p.Name() != "x" {
		t.Errorf("Connect(%q) returned the link to %q", "x", p.Name())
	}
	if r, _ := ab.Remote("kv"); r.ID != kv.Remote().ID {
		t.Errorf("after Connect(%q), peer b's region \"kv\" is id %d (b's %q is %d, its \"kv\" %d)", "x", r.ID, "scratch", scratch.Remote().ID, kv.Remote().ID)
	}
}
