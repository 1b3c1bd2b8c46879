package p2p

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestMisuseImmQueueFullSaysBytesLanded: a WriteWithImm refused because
// the target holds its link's share of undelivered immediates has written
// its bytes all the same; ErrRefused's doc said "nothing was read or
// written", and the error said only "too many undelivered immediates".
// Its error must say that the bytes are in place.
func TestMisuseImmQueueFullSaysBytesLanded(t *testing.T) {
	_, b, ab, _ := pair(t, nil)
	ctx := ctxT(t, 120*time.Second)
	lr, _ := ab.e.Register("l", make([]byte, 8))
	tm := make([]byte, 8*257)
	tr, _ := b.Register("t", tm)
	op := []Op{{Local: lr, Remote: tr.Remote(), RemoteOff: 8 * 256, Len: 8}}
	for sent := 0; sent < maxImmPeer; {
		var fs []*Future
		for ; sent < maxImmPeer && len(fs) < 256; sent++ {
			// Each write in flight to bytes of its own (the target's
			// connections write at once).
			fs = append(fs, ab.WriteWithImm([]Op{{Local: lr, Remote: tr.Remote(), RemoteOff: 8 * len(fs), Len: 8}}, uint32(sent)))
		}
		for _, f := range fs {
			if err := f.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	copy(lr.Bytes(), "NEWBYTES")
	err := ab.WriteWithImm(op, 1).Wait(ctx)
	if !errors.Is(err, ErrRefused) {
		t.Fatalf("a WriteWithImm past the share: %v, want ErrRefused", err)
	}
	if got := string(tm[8*256:]); got == "NEWBYTES" && !strings.Contains(err.Error(), "bytes are in place") {
		t.Errorf("the refused WriteWithImm wrote its bytes (%q) but its error does not say so: %v", got, err)
	}
}
