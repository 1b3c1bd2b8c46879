package inter

import (
	"context"
	"crypto/rand"
	"net"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/testflood"
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
	var loot testflood.Loot
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		other, err := st[0].Get(ctx, "u/addr/2")
		if err != nil {
			return
		}
		m, err := net.Dial("tcp", string(other))
		if err != nil {
			return
		}
		defer m.Close()
		if !testflood.RelayHandshake(c, m) {
			return
		}
		loot.Take(c, 5*time.Second)
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
	if loot.Holds(secret) {
		t.Errorf("the stranger read rank 1's send")
	}
}
