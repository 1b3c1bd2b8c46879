package p2p

import (
	"errors"
	"testing"
	"time"
)

// TestRefusalNamesRegion: a transfer the target refuses (a wrong key)
// names the remote region by the name the initiator called it by, not
// by its wire id, over TCP and on one host.
func TestRefusalNamesRegion(t *testing.T) {
	for _, tcpOnly := range []bool{true, false} {
		a, b, ab, _ := pair(t, func(o *Options) { o.TCPOnly = tcpOnly })
		ctx := ctxT(t, 20*time.Second)
		tr, _ := b.Register("kv", make([]byte, 1<<20))
		lr, _ := a.Register("l", make([]byte, 1<<20))
		rr := tr.Remote()
		rr.Key++
		err := ab.Write([]Op{{Local: lr, Remote: rr, Len: 256 << 10}}).Wait(ctx) // past the size sent over TCP on one host
		var oe *OpError
		if !errors.Is(err, ErrRefused) || !errors.As(err, &oe) || oe.Region != `"kv"` || oe.Op != "write" {
			t.Errorf("tcp-only %v: a write with a wrong key: %v; want ErrRefused naming region \"kv\"", tcpOnly, err)
		}
	}
}
