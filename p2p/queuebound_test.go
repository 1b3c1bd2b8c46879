package p2p

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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
		// frames returns the i-th batch of frames (about 4 KiB), written
		// on the link's last connection.
		frames func(i uint64) []byte
	}{
		{"releases of grants for unknown requests", 1, func(i uint64) []byte {
			var b []byte
			for k := range uint64(64) {
				b = append(b, hdr(header{kind: kResp, sub: rReadV, id: 1<<40 + i*64 + k, b: 1, payload: IovSize})...)
				b = append(b, make([]byte, IovSize)...)
			}
			return b
		}},
		{"refusals of announced sends, answered on another connection", 2, func(i uint64) []byte {
			// Past maxPendingRTS announcements every new one is refused
			// (stBusy) on connection seq%2: even sequences, connection 0.
			var b []byte
			for k := range uint64(170) {
				b = append(b, hdr(header{kind: kReq, sub: rRTS, id: 2 * (i*170 + k), a: 8})...)
			}
			return b
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setLimit(t, &maxQueued, 1<<10)
			ctx := ctxT(t, 60*time.Second)
			b := endpoint(t, ctx, Options{Name: "b", Auth: testAuth(), Heartbeat: 2 * time.Minute})
			cs := make([]net.Conn, tc.channels)
			for ch := range cs {
				// The member's receive buffers are left to the kernel: one
				// of a few KiB, full and never read, makes the kernel drop
				// the target's segments, and with them the acknowledgements
				// of the member's own, which it then resends with backoff
				// (seconds) instead of sending on.
				cs[ch] = member(t, b, helloFrame(7, uint32(ch), uint32(tc.channels), 120000, 0, "peer1"), 0)
			}
			eventually(t, "the link", func() bool { return b.Peer("peer1") != nil })
			// Small send buffers on the target's side, so that its answers
			// wait in its queues after the member's receive buffer (about
			// 128 KiB, some thousands of answers), not after megabytes.
			for _, tc := range b.Peer("peer1").l.conns {
				tc.c.SetWriteBuffer(4096)
			}
			c := cs[len(cs)-1]
			n := uint64(maxPendingRTS)/170 + 16*uint64(maxQueued)/64
			for i := range n {
				c.SetWriteDeadline(time.Now().Add(30 * time.Second))
				if _, err := c.Write(tc.frames(i)); err != nil {
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

// TestOwnCancelsNotCounted: the frames this side's callers cause (a
// cancel of a read given up, like the request itself) are not answers:
// many reads cancelled behind a writer that the peer's slow reading holds
// up do not count against maxQueued, and the link stays.
func TestOwnCancelsNotCounted(t *testing.T) {
	setLimit(t, &maxQueued, 64)
	ctx := ctxT(t, 30*time.Second)
	a := endpoint(t, ctx, Options{Name: "a", Auth: testAuth(), Channels: 1, Heartbeat: time.Minute})
	p, _, rr := fakeTarget(t, a) // it reads nothing: the writes fill the socket and wait
	src, _ := a.Register("src", make([]byte, 1<<20))
	for range 32 {
		p.Write([]Op{{Local: src, Remote: rr, Len: 1 << 20}})
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	for range 4 * maxQueued {
		p.Read([]Op{{Local: src, Remote: rr, Len: 8}}).Wait(done) // cancelled: its cancel is queued
	}
	// over is set in enqueue itself, before the goroutine that fails the
	// link runs: the check does not depend on that goroutine's timing.
	if err := p.l.failed(); err != nil || p.l.over.Load() {
		t.Fatalf("the link failed for this side's own cancels: %v (over the bound: %v)", err, p.l.over.Load())
	}
}

// TestPipelinedReadsOfManyRanges: a correct initiator that keeps many
// reads of many ranges in flight is not taken for one that does not read
// its answers: the bound counts queued answers, not their ranges (with
// maxQueued 4096, 16 reads of 4096 ranges each queue 65536 ranges at the
// target), and every read gets its bytes.
func TestPipelinedReadsOfManyRanges(t *testing.T) {
	setLimit(t, &maxQueued, 1<<12)
	ctx := ctxT(t, 60*time.Second)
	a := endpoint(t, ctx, Options{Name: "a", Auth: testAuth(), TCPOnly: true, Channels: 1})
	b := endpoint(t, ctx, Options{Name: "b", Auth: testAuth(), TCPOnly: true, Channels: 1})
	const ranges, n = 4096, 1 << 10
	mem := make([]byte, ranges*n)
	fill(mem, 11)
	if _, err := b.Register("m", mem); err != nil {
		t.Fatal(err)
	}
	p, err := a.ConnectInfo(ctx, b.Info())
	if err != nil {
		t.Fatal(err)
	}
	rr, _ := p.Remote("m")
	dsts := make([][]byte, 16)
	fs := make([]*Future, len(dsts))
	for i := range dsts {
		dsts[i] = make([]byte, ranges*n)
		lr, err := a.Register(fmt.Sprint("d", i), dsts[i])
		if err != nil {
			t.Fatal(err)
		}
		ops := make([]Op, ranges) // every range of the region, backwards
		for k := range ops {
			ops[k] = Op{Local: lr, LocalOff: k * n, Remote: rr, RemoteOff: (ranges - 1 - k) * n, Len: n}
		}
		fs[i] = p.Read(ops)
	}
	for i, f := range fs {
		if err := f.Wait(ctx); err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		for k := range ranges {
			if !bytes.Equal(dsts[i][k*n:(k+1)*n], mem[(ranges-1-k)*n:(ranges-k)*n]) {
				t.Fatalf("read %d: range %d differs", i, k)
			}
		}
	}
}
