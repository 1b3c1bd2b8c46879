package p2p

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"sync"
	"testing"
	"time"
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
func TestStrangerReflectsHandshake(t *testing.T) {
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
	bAddr := b.Addr()
	b.Close() // its Info, and the region's, stay in the store
	ln, err := net.Listen("tcp", bAddr)
	if err != nil {
		t.Skipf("the closed endpoint's port %s is taken again: %v", bAddr, err)
	}
	defer ln.Close()

	var mu sync.Mutex
	var stolen []byte
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		// a's listener, for its challenge (a stranger finds it in
		// /proc/net/tcp, where every listening socket of the host shows).
		m, err := net.Dial("tcp", a.Addr())
		if err != nil {
			return
		}
		defer m.Close()
		// relay passes n bytes from src to dst, or as many as come
		// before src ends (a verdict of refusal is one byte).
		relay := func(dst io.Writer, src io.Reader, n int) bool {
			buf := make([]byte, n)
			k, err := io.ReadFull(src, buf)
			dst.Write(buf[:k])
			return err == nil
		}
		// a's listener's hello to a's dial; the dial's proof to the
		// listener; the listener's verdict and proof back to the dial.
		if !relay(c, m, 41) || !relay(m, c, 73) || !relay(c, m, 33) {
			return
		}
		// The link's hello from a, answered as b would.
		var hb [HeaderSize + helloFixed + MaxName]byte
		if _, err := io.ReadFull(c, hb[:HeaderSize]); err != nil {
			return
		}
		h, err := decodeHeader(hb[:HeaderSize])
		if err != nil {
			return
		}
		if _, err := io.ReadFull(c, hb[HeaderSize:HeaderSize+int(h.payload)]); err != nil {
			return
		}
		ack := header{kind: kHelloAck, status: stOK, a: 10000, id: nameTag("b")}
		ack.put(hb[:])
		if _, err := c.Write(hb[:HeaderSize]); err != nil {
			return
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 256<<10)
		for {
			n, err := c.Read(buf)
			mu.Lock()
			stolen = append(stolen, buf[:n]...)
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()

	secret := make([]byte, 64<<10)
	rand.Read(secret)
	p, err := a.Connect(ctx, "b")
	if err != nil {
		t.Logf("Connect to the stranger: %v", err)
	} else {
		la, err := a.Register("mine", secret)
		if err != nil {
			t.Fatal(err)
		}
		f := p.Write([]Op{{Local: la, Remote: remote, Len: len(secret)}})
		f.Wait(ctxT(t, 3*time.Second))
		ln.Close()
		t.Errorf("a stranger with no secret answered a's handshake with a's own and holds a's link to \"b\"")
	}
	ln.Close()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if bytes.Contains(stolen, secret) {
		t.Errorf("the stranger read a's %d-byte write to b's region, byte for byte", len(secret))
	}
}
