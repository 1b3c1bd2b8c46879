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
		m, err := net.Dial("tcp", b2.Addr())
		if err != nil {
			return
		}
		defer m.Close()
		relay := func(dst io.Writer, src io.Reader, n int) bool {
			buf := make([]byte, n)
			k, err := io.ReadFull(src, buf)
			dst.Write(buf[:k])
			return err == nil
		}
		if !relay(c, m, 41) || !relay(m, c, 73) || !relay(c, m, 33) {
			return
		}
		var hb [HeaderSize + helloFixed + MaxName]byte
		if _, err := io.ReadFull(c, hb[:HeaderSize]); err != nil {
			return
		}
		h, _ := decodeHeader(hb[:HeaderSize])
		io.ReadFull(c, hb[HeaderSize:HeaderSize+int(h.payload)])
		ack := header{kind: kHelloAck, status: stOK, a: 10000, id: nameTag("b")}
		ack.put(hb[:])
		c.Write(hb[:HeaderSize])
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
	mu.Lock()
	defer mu.Unlock()
	if bytes.Contains(stolen, secret) {
		t.Errorf("stranger read a's %d-byte write", len(secret))
	}
}
