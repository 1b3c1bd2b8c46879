package p2p

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestDataFrameWithinHeartbeat: a data frame must arrive whole within a
// heartbeat of its header (docs/P2P.md, "Known limits"), however its
// bytes trickle in. A read into GPU memory is staged range by range; a
// peer that answered one of 64 one-byte ranges a third of a heartbeat
// apart kept the reader inside the frame, holding the part's lock, for
// 21 heartbeats: a cancelled Wait waited that long. Now the link fails a
// heartbeat after the frame's header, and the Wait returns.
func TestDataFrameWithinHeartbeat(t *testing.T) {
	if gpuErr != nil {
		t.Skip("no emulated GPU:", gpuErr)
	}
	const n = 64
	a := endpoint(t, ctxT(t, 60*time.Second), Options{Name: "a", Auth: testAuth(), Channels: 1, Heartbeat: time.Second})
	p, c, rr := fakeTarget(t, a)
	d, err := gpuMem(2*n, 3)
	if err != nil {
		t.Fatal(err)
	}
	lr, err := a.Register("dst", d)
	if err != nil {
		t.Fatal(err)
	}
	ops := make([]Op, n) // every other byte: 64 ranges, staged one by one
	for i := range ops {
		ops[i] = Op{Local: lr, LocalOff: 2 * i, Remote: rr, RemoteOff: i, Len: 1}
	}
	f := p.Read(ops)
	h, _ := nextFrame(t, c)
	c.Write(append(hdr(header{kind: kResp, sub: rRead, id: h.id, a: n}), hdr(header{kind: kData, id: h.id, payload: n})...))
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for range n {
			select {
			case <-stop:
				return
			case <-time.After(330 * time.Millisecond):
			}
			if _, err := c.Write([]byte{7}); err != nil {
				return
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	err = f.Wait(ctx)
	if took := time.Since(t0); took > 5*time.Second {
		t.Fatalf("the Wait returned after %v: %v", took.Round(time.Millisecond), err)
	}
	if !errors.Is(err, ErrTimeout) && !errors.Is(err, ErrPeerLost) && !errors.Is(err, ErrCancelled) {
		t.Fatalf("%v, want the link's failure or the Wait's end", err)
	}
}
