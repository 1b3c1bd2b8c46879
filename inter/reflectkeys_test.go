package inter

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// TestStrangerRelaysAcrossKeys: rank 2 of another communicator of the job
// (store key "u": a sub-group, or the GPU path's second transport) is
// listening while rank 1 of "t" dials the address published for "t"'s
// rank 2, which a stranger holds: it relayed the handshake to "u"'s rank
// 2, which proved "transport:2", and rank 1 took the stranger for its
// rank 2 and sent it its data. The proof now names the communicator's key
// and the address dialed as well.
func TestStrangerRelaysAcrossKeys(t *testing.T) {
	st := testStore(t, 2)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := st[0].Set(ctx, "t/addr/2", []byte(ln.Addr().String())); err != nil {
		t.Fatal(err)
	}
	// rank 2 of "u", waiting for rank 1 of "u" to dial it.
	go New(ctx, Config{Store: st[1], Key: "u", Rank: 2, World: 3, Peers: []int{1}, Channels: 1, MasterAddr: "127.0.0.1",
		Timeout: 8 * time.Second, Auth: testKey, HandshakeTimeout: 2 * time.Second})
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
		var other []byte
		for other == nil {
			v, err := st[0].Get(ctx, "u/addr/2")
			if err != nil {
				return
			}
			other = v
		}
		m, err := net.Dial("tcp", string(other))
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
		if !relay(c, m, 41) || !relay(m, c, handshakeProof) || !relay(c, m, 33) {
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
	cfg := Config{Store: st[0], Key: "t", Rank: 1, World: 3, Peers: []int{2}, Channels: 1, MasterAddr: "127.0.0.1",
		Timeout: 5 * time.Second, Auth: testKey, HandshakeTimeout: 2 * time.Second}
	secret := make([]byte, 64<<10)
	rand.Read(secret)
	tr, err := New(ctx, cfg)
	if err != nil {
		t.Logf("refused: %v", err)
	} else {
		tr.Send(2, 1, 0, secret, time.Now().Add(2*time.Second))
		tr.WaitSend(2)
		tr.Close()
		t.Errorf("rank 1 of \"t\" linked to the stranger as rank 2 through rank 2 of \"u\"'s proof")
	}
	ln.Close()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if bytes.Contains(stolen, secret) {
		t.Errorf("the stranger read rank 1's send")
	}
}
