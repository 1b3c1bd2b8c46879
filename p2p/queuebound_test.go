package p2p

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// TestAnswersBoundedEveryPath: the bound on answers waiting for a
// connection's writer (maxQueued) holds whatever frame caused them and
// whichever connection they wait on, not only for requests answered on
// the connection they came on: a member that never reads has its link
// closed.
func TestAnswersBoundedEveryPath(t *testing.T) {
	for _, tc := range []struct {
		name     string
		channels int
		// frames returns the i-th batch of frames (a few KiB), written
		// on the link's last connection; rr is the target's region.
		frames func(i uint64, rr RemoteRegion) []byte
	}{
		{"releases of grants for unknown requests", 1, func(i uint64, _ RemoteRegion) []byte {
			var b []byte
			for k := range uint64(64) {
				b = append(b, hdr(header{kind: kResp, sub: rReadV, id: 1<<40 + i*64 + k, b: 1, payload: IovSize})...)
				b = append(b, make([]byte, IovSize)...)
			}
			return b
		}},
		{"refusals of announced sends, answered on another connection", 2, func(i uint64, _ RemoteRegion) []byte {
			// Past maxPendingRTS announcements every new one is refused
			// (stBusy) on connection seq%2: even sequences, connection 0.
			var b []byte
			for k := range uint64(170) {
				b = append(b, hdr(header{kind: kReq, sub: rRTS, id: 2 * (i*170 + k), a: 8})...)
			}
			return b
		}},
		{"reads of many ranges, counted by their ranges", 1, func(i uint64, rr RemoteRegion) []byte {
			// One read of 64 KiB in 256 ranges: with maxQueued 1024, the
			// target queues five at most, where counted as one answer each
			// it would queue a thousand.
			const ranges, n = 256, 256
			p := make([]byte, stripeSize+ranges*DescSize)
			for k := range uint64(ranges) {
				(&desc{rr.ID, rr.Key, k * n, n}).put(p[stripeSize+k*DescSize:])
			}
			return append(hdr(header{kind: kReq, sub: rRead, id: i + 1, a: ranges * n, b: ranges, payload: uint32(len(p))}), p...)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setLimit(t, &maxQueued, 1<<10)
			ctx := ctxT(t, 60*time.Second)
			b := endpoint(t, ctx, Options{Name: "b", Auth: testAuth(), Heartbeat: 2 * time.Minute})
			r, _ := b.Register("m", make([]byte, 64<<10))
			cs := make([]net.Conn, tc.channels)
			for ch := range cs {
				cs[ch] = member(t, b, helloFrame(7, uint32(ch), uint32(tc.channels), 120000, 0, "peer1"), 4096)
			}
			eventually(t, "the link", func() bool { return b.Peer("peer1") != nil })
			// Small socket buffers on the target's side, so that its
			// answers wait in its queues after a few hundred, not after
			// megabytes of them (the member's writes meanwhile are
			// retransmitted, with backoff, as its receive buffer drops
			// the target's segments that carry their acknowledgements).
			for _, tc := range b.Peer("peer1").l.conns {
				tc.c.SetWriteBuffer(4096)
			}
			c := cs[len(cs)-1]
			n := uint64(maxPendingRTS)/170 + 4*uint64(maxQueued)/64
			for i := range n {
				c.SetWriteDeadline(time.Now().Add(30 * time.Second))
				if _, err := c.Write(tc.frames(i, r.Remote())); err != nil {
					if errors.Is(err, os.ErrDeadlineExceeded) {
						t.Fatalf("after %d batches the target stopped reading and kept the link", i)
					}
					break // the target closed the link
				}
			}
			eventually(t, "the target to close the link of a peer that does not read its answers", func() bool { return b.Peer("peer1") == nil })
		})
	}
}

// TestSendClearedTwice: a receiver clears a send once; a member that
// clears one send again and again (each clear would queue the whole send
// again, a flood of this side's bytes for one small frame) has its link
// closed, and the send fails.
func TestSendClearedTwice(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	b := endpoint(t, ctx, Options{Name: "b", Auth: testAuth(), Heartbeat: 2 * time.Minute})
	c := member(t, b, helloFrame(7, 0, 1, 120000, 0, "peer1"), 0)
	eventually(t, "the link", func() bool { return b.Peer("peer1") != nil })
	f := b.Peer("peer1").Send(make([]byte, 1<<20))
	h, _ := nextFrame(t, c)
	if h.kind != kReq || h.sub != rRTS {
		t.Fatalf("got %+v, want the send's announcement", h)
	}
	for range 3 {
		c.Write(hdr(header{kind: kReq, sub: rCTS, id: h.id}))
	}
	if err := f.Wait(ctx); !errors.Is(err, ErrPeerLost) {
		t.Fatalf("the send cleared three times: %v, want ErrPeerLost", err)
	}
	eventually(t, "the link closed", func() bool { return b.Peer("peer1") == nil })
}
