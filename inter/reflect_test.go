package inter

import (
	"context"
	"crypto/rand"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/testflood"
)

// TestStrangerReflectsHandshake plays a process that holds no secret of
// the job (any user of rank 2's host may be it) and listens at the address
// rank 2 published before it died (its port free, the address still in
// the store). Rank 1 dials it; the stranger opens a connection to rank
// 1's own listener, hands the listener's challenge to rank 1's dial as its
// own, the dial's proof to the listener and the listener's proof back. A
// handshake that proves only the job passes both ways, and the stranger,
// who then says in its hello on the listener's connection that it is rank
// 0, stands for ranks 0 and 2 both: rank 1's New must fail, and no byte
// of what it sends to "rank 2" may reach the stranger.
func TestStrangerReflectsHandshake(t *testing.T) {
	st := testStore(t, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0") // the dead rank 2's port, taken
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := Config{Store: st[0], Key: "t", Rank: 1, World: 3, Peers: []int{0, 2}, Channels: 1, MasterAddr: "127.0.0.1",
		Timeout: 5 * time.Second, Auth: testKey, HandshakeTimeout: 2 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := st[0].Set(ctx, "t/addr/2", []byte(ln.Addr().String())); err != nil {
		t.Fatal(err)
	}

	var loot testflood.Loot
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept() // rank 1's dial to "rank 2"
		if err != nil {
			return
		}
		defer c.Close()
		// Rank 1's listener: read from the store for brevity; a stranger
		// finds it in /proc/net/tcp, where every listening socket of the
		// host shows, or by trying the ports.
		own, err := st[0].Get(ctx, "t/addr/1")
		if err != nil {
			return
		}
		m, err := net.Dial("tcp", string(own))
		if err != nil {
			return
		}
		defer m.Close()
		if !testflood.RelayHandshake(c, m) {
			return
		}
		var hb [HeaderSize]byte
		(&Header{Kind: KindHello, Sender: 0, Epoch: 0}).Put(hb[:]) // "rank 0, channel 0"
		if _, err := m.Write(hb[:]); err != nil {
			return
		}
		loot.Take(c, 5*time.Second)
	}()

	secret := make([]byte, 64<<10)
	rand.Read(secret)
	tr, err := New(ctx, cfg)
	if err != nil {
		t.Logf("rank 1's New with the stranger at rank 2's address: %v", err)
		if !errors.Is(err, ErrDenied) {
			t.Errorf("rank 1's New: %v, want ErrDenied", err)
		}
	} else {
		tr.Send(2, 1, 0, secret, time.Now().Add(2*time.Second))
		tr.WaitSend(2)
		tr.Close()
		t.Errorf("a stranger with no secret answered rank 1's handshake with rank 1's own: New linked rank 1 to it as ranks 0 and 2")
	}
	ln.Close()
	<-done
	if loot.Holds(secret) {
		t.Errorf("the stranger read rank 1's %d-byte send to rank 2, byte for byte", len(secret))
	}
}
