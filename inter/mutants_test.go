package inter

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/internal/teststore"
	"github.com/slimego/slimego/rendezvous"
)

// Tests that kill survivors of `make mutate MUTATE=inter`
// (docs/MUTATION.md).

// TestHierAloneRides: a hierarchical all-gather of one node of one rank
// (no transport peer) puts the rank's own block in place out of place,
// also where blocks would ride with a send (SendCopyMin 1): with no send,
// nothing rides and the node's own copy is made.
func TestHierAloneRides(t *testing.T) {
	for _, sendCopyMin := range []int{0, 1} {
		for _, n := range []int{5, 70_001} {
			t.Run(fmt.Sprintf("sendcopymin%d/n%d", sendCopyMin, n), func(t *testing.T) {
				errs := clusterWith(t, 1, 1, false, sendCopyMin, func(rank int, ag allGatherer) error {
					for it := range 2 {
						src := make([]byte, n)
						fillBlock(src, rank, it)
						dst := make([]byte, n)
						fillBlock(dst, 999, it) // stale bytes
						if err := ag.run(context.Background(), "allgather", dst, src, []int{n}, []int{0}); err != nil {
							return fmt.Errorf("call %d: %w", it, err)
						}
						if !bytes.Equal(dst, src) {
							return fmt.Errorf("call %d: the own block is not in place", it)
						}
					}
					return ag.barrier(context.Background())
				})
				for r, err := range errs {
					if err != nil {
						t.Errorf("rank %d: %v", r, err)
					}
				}
			})
		}
	}
}

// TestConfigPollMax: a Config that leaves PollMax zero polls for up to
// DefaultPollMax, a set PollMax is kept, and a negative one never polls;
// every connection's reader gets it, and a message then crosses.
func TestConfigPollMax(t *testing.T) {
	for _, c := range []struct{ in, want time.Duration }{{0, DefaultPollMax}, {3 * time.Microsecond, 3 * time.Microsecond}, {-1, 0}} {
		t.Run(fmt.Sprint(c.in), func(t *testing.T) {
			ts := pairWith(t, Config{PollMax: c.in})
			for r, tr := range ts {
				if tr.cfg.PollMax != c.want {
					t.Errorf("rank %d: PollMax %v, want %v", r, tr.cfg.PollMax, c.want)
				}
				for i, cn := range tr.peers[1-r].conns {
					if cn.rd.PollMax != c.want {
						t.Errorf("rank %d: connection %d polls for up to %v, want %v", r, i, cn.rd.PollMax, c.want)
					}
				}
			}
			exchange(t, ts, 3*StripeMin+1, 1)
		})
	}
}

// rawConns are the connections of tr to peer p, for a test to write
// frames on as a peer that breaks the protocol would (tr's own reader and
// writer goroutines touch a socket only for a job of tr's).
func rawConns(tr *Transport, p int) []*net.TCPConn {
	var cs []*net.TCPConn
	for _, c := range tr.peers[p].conns {
		cs = append(cs, c.c)
	}
	return cs
}

// frameBytes is a data frame's header from rank 1 for call epoch (hash
// 7), a message of total bytes in stripes frames whose frame carries count,
// followed by n bytes of its payload.
func frameBytes(epoch uint64, count, total, stripes, n int) []byte {
	h := Header{Kind: KindData, Sender: 1, Epoch: epoch, Hash: 7, Count: uint64(count), Total: uint64(total), Stripes: uint32(stripes)}
	b := make([]byte, HeaderSize+n)
	h.Put(b)
	for i := range n {
		b[HeaderSize+i] = byte(i)
	}
	return b
}

// TestFramesCutShort: rank 1's frames end before their payload does (rank
// 1 stops writing and shuts its connections down). Rank 0's receive
// reports the lost peer, never success and never a mere mismatch: a
// frame cut short in its first stripe (read in the caller's goroutine), in
// a later stripe (read by that connection's goroutine), or while rank 0
// drains a message that is not the one it expects. Where a first frame is
// cut short and a later stripe then times out, the first error is the one
// reported (WaitRecv's contract).
func TestFramesCutShort(t *testing.T) {
	const small = 1000 // received in the caller's goroutine
	big := 2 * StripeMin
	for _, tc := range []struct {
		name   string
		expect int
		frames [][]byte // rank 1's bytes on each connection; nil: none
		shut   []int    // the connections rank 1 then shuts down
		wait   time.Duration
	}{
		{"first frame", small, [][]byte{frameBytes(1, small, small, 1, 400)}, []int{0}, 10 * time.Second},
		{"later stripe", big, [][]byte{frameBytes(1, StripeMin, big, 2, StripeMin), frameBytes(1, StripeMin, big, 2, 1000)}, []int{1}, 10 * time.Second},
		{"drained frame", small, [][]byte{frameBytes(1, 5000, 5000, 1, 100)}, []int{0}, 10 * time.Second},
		{"drained later stripe", small, [][]byte{frameBytes(1, StripeMin, big, 2, StripeMin), frameBytes(1, StripeMin, big, 2, 100)}, []int{1}, 10 * time.Second},
		// Connection 1 stays silent: its frame's wait ends at the
		// deadline, after connection 0's loss.
		{"first error kept", small, [][]byte{frameBytes(1, StripeMin, big, 2, 100)}, []int{0}, 4 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := pair(t, 0)
			if ts[0].Direct(tc.expect) != (tc.expect == small) {
				t.Fatalf("Direct(%d) = %v", tc.expect, ts[0].Direct(tc.expect))
			}
			raw := rawConns(ts[1], 0)
			dl := time.Now().Add(tc.wait)
			buf := make([]byte, tc.expect)
			ts[0].Recv(1, 1, 7, buf, dl)
			for ch, b := range tc.frames {
				go func() {
					raw[ch].Write(b)
					if slices.Contains(tc.shut, ch) {
						raw[ch].CloseWrite()
					}
				}()
			}
			done := make(chan error, 1)
			go func() { done <- ts[0].WaitRecv(1) }()
			var err error
			select {
			case err = <-done:
			case <-time.After(tc.wait + 10*time.Second):
				t.Fatalf("WaitRecv has not returned %v after its deadline", 10*time.Second)
			}
			if !errors.Is(err, fault.ErrPeerLost) || errors.Is(err, ErrMismatch) {
				t.Fatalf("want ErrPeerLost, got %v", err)
			}
			t.Logf("%v", err)
		})
	}
}

// TestDirectSendToResetPeer: a message sent in the caller's goroutine to a
// peer whose connection has been reset fails: WaitSend reports the lost
// peer (the vectored write's error is the send's).
func TestDirectSendToResetPeer(t *testing.T) {
	ts := pair(t, 0)
	const n = 1000
	if !ts[0].Direct(n) {
		t.Fatalf("%d bytes are not sent directly", n)
	}
	raw := rawConns(ts[1], 0)[0]
	raw.SetLinger(0)
	raw.Close() // a reset, not an orderly end
	buf := make([]byte, n)
	// The reset reaches rank 0's socket asynchronously; the first write
	// after it fails.
	for it := 0; ; it++ {
		ts[0].Send(1, uint64(it), 7, buf, time.Now().Add(10*time.Second))
		err := ts[0].WaitSend(1)
		if err != nil {
			if !errors.Is(err, fault.ErrPeerLost) {
				t.Fatalf("send %d: want ErrPeerLost, got %v", it, err)
			}
			t.Logf("send %d: %v", it, err)
			return
		}
		if it == 500 {
			t.Fatalf("%d sends to a reset connection succeeded", it+1)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestConnectDeadline: New gives up at its Timeout from now, or at its
// context's deadline if that comes first; at the context's deadline alone
// where Timeout is unset (zero), and DefaultConnectTimeout from now where
// neither is set. Two transports with Timeout unset then connect under
// their context's deadline.
func TestConnectDeadline(t *testing.T) {
	base := time.Now()
	for _, c := range []struct {
		ctxIn   time.Duration // the context's deadline from base; 0: none
		timeout time.Duration
		// the deadline wanted: from the call's start (fromNow) or the
		// context's
		fromNow time.Duration
	}{
		{0, 0, DefaultConnectTimeout},
		{0, 2 * time.Hour, 2 * time.Hour},
		{0, -time.Second, DefaultConnectTimeout},
		{time.Hour, 0, 0},
		{time.Hour, 2 * time.Hour, 0},
		{3 * time.Hour, 2 * time.Hour, 2 * time.Hour},
	} {
		ctx := context.Background()
		if c.ctxIn > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, base.Add(c.ctxIn))
			defer cancel()
		}
		t0 := time.Now()
		got := connectDeadline(ctx, c.timeout)
		t1 := time.Now()
		if c.fromNow == 0 {
			if want := base.Add(c.ctxIn); !got.Equal(want) {
				t.Errorf("context deadline in %v, Timeout %v: gives up at %v, want the context's deadline %v", c.ctxIn, c.timeout, got, want)
			}
		} else if got.Before(t0.Add(c.fromNow)) || got.After(t1.Add(c.fromNow)) {
			t.Errorf("context deadline in %v, Timeout %v: gives up %v from now, want %v", c.ctxIn, c.timeout, got.Sub(t0), c.fromNow)
		}
	}
	errs := teststore.Run(t, 2, 20*time.Second, func(ctx context.Context, st *rendezvous.Client, r int) error {
		tr, err := New(ctx, Config{Store: st, Key: "t", Rank: r, Peers: []int{1 - r}, MasterAddr: "127.0.0.1", Auth: testKey})
		if err == nil {
			tr.Close()
		}
		return err
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d, Timeout unset: %v", r, err)
		}
	}
}

// TestEvictStale: MaxPendingHandshakes silent connections, held open, fill
// every pending slot and have all lasted EvictAfter; each of the real
// peer's connections takes the place of the oldest, and the two ranks
// connect although the silent handshakes would last to New's deadline.
func TestEvictStale(t *testing.T) {
	const timeout = 8 * time.Second
	st := testStore(t, 3)
	cfg1 := rankConfig(st[1], 1, testKey, timeout)
	cfg1.HandshakeTimeout = timeout
	acceptor := start(t, cfg1)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	addr, err := st[2].Get(ctx, "t/addr/1")
	if err != nil {
		t.Fatal(err)
	}
	for range MaxPendingHandshakes {
		c, err := net.DialTimeout("tcp", string(addr), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	// Not a measurement: the silent handshakes age past EvictAfter.
	time.Sleep(EvictAfter + 500*time.Millisecond)
	dialer := start(t, rankConfig(st[0], 0, testKey, timeout))
	for r, c := range []<-chan started{dialer, acceptor} {
		if s := await(t, c, timeout+5*time.Second); s.err != nil {
			t.Fatalf("rank %d, every pending slot held by a stale handshake: %v", r, s.err)
		}
	}
}

// slowReader reads at most 16 KiB at a time.
type slowReader struct{ c net.Conn }

func (r slowReader) Read(b []byte) (int, error) { return r.c.Read(b[:min(len(b), 16<<10)]) }

// TestDirectShortWrites: the largest messages sent in the caller's
// goroutine, many times what the socket buffers hold, to a peer that
// starts reading only later and then reads little at a time: a vectored
// write is cut short (the socket's memory runs out in a header or a
// payload) and resumed where it stopped once there is room, and every
// frame arrives whole and in order.
func TestDirectShortWrites(t *testing.T) {
	ts := pairWith(t, Config{Channels: 1})
	n := ts[0].direct
	if n <= 0 || !ts[0].Direct(n) {
		t.Fatalf("Direct(%d) = false", n)
	}
	raw := rawConns(ts[1], 0)[0]
	const msgs = 64
	payload := func(it int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(it*7 + i)
		}
		return b
	}
	sent := make(chan error, 1)
	go func() {
		for it := range msgs {
			ts[0].Send(1, uint64(it), 7, payload(it), time.Now().Add(time.Minute))
			if err := ts[0].WaitSend(1); err != nil {
				sent <- fmt.Errorf("send %d: %w", it, err)
				return
			}
		}
		sent <- nil
	}()
	// Not a measurement: the sender fills the sockets before the first read.
	time.Sleep(200 * time.Millisecond)
	raw.SetReadDeadline(time.Now().Add(20 * time.Second))
	rd := slowReader{raw}
	frame := make([]byte, HeaderSize+n)
	for it := range msgs {
		if _, err := io.ReadFull(rd, frame); err != nil {
			t.Fatalf("frame %d of %d (%d-byte payloads): %v", it, msgs, n, err)
		}
		h, err := Decode(frame)
		if err != nil || h.Kind != KindData || h.Sender != 0 || h.Epoch != uint64(it) || h.Count != uint64(n) || h.Total != uint64(n) || h.Stripes != 1 {
			t.Fatalf("frame %d: header %+v, %v", it, h, err)
		}
		if !bytes.Equal(frame[HeaderSize:], payload(it)) {
			t.Fatalf("frame %d: the payload differs from the one sent", it)
		}
	}
	select {
	case err := <-sent:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the sends have not returned 20 s after their last frame was read")
	}
}
