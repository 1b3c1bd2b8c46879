package p2p

import (
	"crypto/rand"
	"io"
	"net"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/testflood"
)

// TestStrangerReflectsHandshake plays a process that holds no secret of
// the job (any user of the host may be it) and listens on the port that a
// closed endpoint "b" left (its Info stays in the store). When "a"
// connects to "b", the stranger answers a's handshake with a's own: it
// opens a connection to a's listener, hands a's challenge to a's dial as
// its own, and a's dial's proof to a's listener, whose proof it hands
// back. A handshake that proves only the job (not which endpoint answers)
// passes, and the stranger, who then writes the hello's answer itself
// (stOK, the tag of "b"), holds a's link to "b": every byte a writes to
// b's regions is the stranger's. Connect must fail, and no byte of a's
// write may reach the stranger.
func TestStrangerReflectsHandshake(t *testing.T) { strangerRelays(t, false) }

// TestStrangerRelaysToRestarted: a stale Info of "b" (b closed, its port
// now a stranger's) while a new endpoint named "b" (a worker restarted
// under its name) listens elsewhere: the stranger relayed a's handshake
// to the new b, which proved "p2p:b", and held a's link and read its
// write. The proof now names the address dialed as well, which the new b
// does not listen at: the connection is refused, and nothing is read.
func TestStrangerRelaysToRestarted(t *testing.T) { strangerRelays(t, true) }

// strangerRelays is a stranger at the port that endpoint "b" left, who
// relays a's handshake to a's own listener, or (restarted) to a new
// endpoint named "b", and answers the hello as b; a connects with b's
// old Info and writes to b's region.
func strangerRelays(t *testing.T, restarted bool) {
	_, st := storeFor(t)
	ctx := ctxT(t, 20*time.Second)
	tune := func(o *Options) { o.Channels, o.TCPOnly, o.HandshakeTimeout = 1, true, 3*time.Second }
	a := published(t, ctx, st, "a", tune)
	b := published(t, ctx, st, "b", tune)
	rb, err := b.Register("buf", make([]byte, 64<<10))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	remote, oldInfo, bAddr := rb.Remote(), b.Info(), b.Addr()
	b.Close() // its Info, and the region's, stay in the store
	// The listener the stranger relays to: a's own (a stranger finds it
	// in /proc/net/tcp, where every listening socket of the host shows),
	// or the restarted b's, which takes the name over.
	target := a.Addr()
	if restarted {
		target = published(t, ctx, st, "b", tune).Addr()
	}
	ln, err := net.Listen("tcp", bAddr)
	if err != nil {
		t.Skipf("the closed endpoint's port %s is taken again: %v", bAddr, err)
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
		m, err := net.Dial("tcp", target)
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
		t.Logf("connecting to the stranger: %v", err)
	} else {
		la, err := a.Register("mine", secret)
		if err != nil {
			t.Fatal(err)
		}
		f := p.Write([]Op{{Local: la, Remote: remote, Len: len(secret)}})
		f.Wait(ctxT(t, 3*time.Second))
		t.Errorf("a stranger with no secret holds a's link to \"b\" (restarted b: %v)", restarted)
	}
	ln.Close()
	<-done
	if loot.Holds(secret) {
		t.Errorf("the stranger read a's %d-byte write to b's region, byte for byte", len(secret))
	}
}

// answerHelloAs reads the link's hello on c and answers it as the
// endpoint named name would (stOK): a stranger standing for it.
func answerHelloAs(c net.Conn, name string) error {
	var hb [HeaderSize + helloFixed + MaxName]byte
	if _, err := io.ReadFull(c, hb[:HeaderSize]); err != nil {
		return err
	}
	h, err := decodeHeader(hb[:HeaderSize])
	if err != nil {
		return err
	}
	if _, err := io.ReadFull(c, hb[HeaderSize:HeaderSize+int(h.payload)]); err != nil {
		return err
	}
	ack := header{kind: kHelloAck, status: stOK, a: 10000, id: nameTag(name)}
	ack.put(hb[:])
	_, err = c.Write(hb[:HeaderSize])
	return err
}
