package p2p

import (
	"crypto/rand"
	"net"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/testflood"
)

// TestStrangerRelaysToRestarted: a stale Info of "b" (b closed, its port
// now a stranger's) while a new endpoint named "b" (a worker restarted
// under its name) listens elsewhere: the stranger relayed a's handshake
// to the new b, which proved "p2p:b", and held a's link and read its
// write. The proof now names the address dialed as well, which the new b
// does not listen at: ConnectInfo is refused, and nothing is read.
func TestStrangerRelaysToRestarted(t *testing.T) {
	_, st := storeFor(t)
	ctx := ctxT(t, 20*time.Second)
	tune := func(o *Options) { o.Channels, o.TCPOnly, o.HandshakeTimeout = 1, true, 3*time.Second }
	a := published(t, ctx, st, "a", tune)
	b := published(t, ctx, st, "b", tune)
	mem := make([]byte, 64<<10)
	rb, err := b.Register("buf", mem)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	remote := rb.Remote()
	oldInfo := b.Info()
	bAddr := b.Addr()
	b.Close()
	b2 := published(t, ctx, st, "b", tune) // the restarted "b" takes the name over
	ln, err := net.Listen("tcp", bAddr)
	if err != nil {
		t.Skipf("port taken: %v", err)
	}
	defer ln.Close()
	var loot testflood.Loot
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		m, err := net.Dial("tcp", b2.Addr())
		if err != nil {
			return
		}
		defer m.Close()
		if !testflood.RelayHandshake(c, m) {
			return
		}
		if answerHelloAs(c, "b") == nil {
			loot.Take(c, 5*time.Second)
		}
	}()
	secret := make([]byte, 64<<10)
	rand.Read(secret)
	p, err := a.ConnectInfo(ctx, oldInfo)
	if err != nil {
		t.Logf("ConnectInfo refused: %v", err)
	} else {
		la, _ := a.Register("mine", secret)
		f := p.Write([]Op{{Local: la, Remote: remote, Len: len(secret)}})
		f.Wait(ctxT(t, 3*time.Second))
		t.Errorf("stranger holds a's link to b via the restarted b's proof")
	}
	ln.Close()
	<-done
	if loot.Holds(secret) {
		t.Errorf("stranger read a's %d-byte write", len(secret))
	}
}
