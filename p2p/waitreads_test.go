package p2p

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"
)

// TestWaitReadsItsAnswer: a Wait for a small read takes its connection's
// socket and reads the answer itself (own_linux.go); every byte is the
// target's, for reads of 8 bytes to 2 KiB.
func TestWaitReadsItsAnswer(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	_, b, ab, _ := pair(t, func(o *Options) { o.TCPOnly = true; o.Channels = 1 })
	src := make([]byte, 4096)
	fill(src, 11)
	sr, _ := b.Register("src", src)
	dst := make([]byte, len(src))
	dr, _ := ab.e.Register("dst", dst)
	c := ab.l.conns[0]
	before := c.waitFrames.Load()
	for i := range 500 {
		c.spin = time.Minute // in one process an answer may take longer than the default budget
		off, n := i*8%len(src), 8<<(i%9)%len(src)
		n = min(n, len(src)-off)
		if err := ab.Read([]Op{{Local: dr, LocalOff: off, Remote: sr.Remote(), RemoteOff: off, Len: n}}).Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(dst[off:off+n], src[off:off+n]) {
			t.Fatalf("read %d: %d bytes at %d differ", i, n, off)
		}
	}
	// In one process an answer often comes before its Wait starts: the
	// reader goroutine has it then.
	if got := c.waitFrames.Load() - before; got == 0 {
		t.Fatalf("no Wait of 500 reads read its answer itself (%d hand-overs, %d parks, budget %v)", c.handed.Load(), c.waker.parks.Load(), c.spin)
	}
}

// TestWaitReadsBothWays: both ends read each other's memory at once over
// one connection, so that each side's requests arrive while its Waits
// hold the socket, and just as they give it back. A request left unread
// when a Wait gives the socket back would wait for the next ping (a
// quarter of the 20 s heartbeat), past each Wait's 3 s.
func TestWaitReadsBothWays(t *testing.T) {
	ctx := ctxT(t, 60*time.Second)
	a, b, ab, ba := pair(t, func(o *Options) { o.TCPOnly = true; o.Channels = 1; o.Heartbeat = 20 * time.Second })
	const size, rounds, workers = 1 << 12, 1500, 2
	type side struct {
		p        *Peer
		src, dst []byte
		sr, dr   *Region
	}
	mk := func(e *Endpoint, p *Peer, seed uint64) *side {
		s := &side{p: p, src: make([]byte, size), dst: make([]byte, workers*size)} // a part of dst per worker
		fill(s.src, seed)
		s.sr, _ = e.Register(fmt.Sprint("src", seed), s.src)
		s.dr, _ = e.Register(fmt.Sprint("dst", seed), s.dst)
		return s
	}
	sa, sb := mk(a, ab, 1), mk(b, ba, 2)
	var wg sync.WaitGroup
	errs := make(chan error, 2*workers)
	for _, pr := range [][2]*side{{sa, sb}, {sb, sa}} {
		me, other := pr[0], pr[1]
		for w := range workers {
			wg.Go(func() {
				for r := range rounds {
					off := r * 8 % size
					lo := w*size + off
					wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
					err := me.p.Read([]Op{{Local: me.dr, LocalOff: lo, Remote: other.sr.Remote(), RemoteOff: off, Len: 8}}).Wait(wctx)
					cancel()
					if err != nil {
						errs <- fmt.Errorf("%s round %d: %w", me.p.Name(), r, err)
						return
					}
					if !bytes.Equal(me.dst[lo:lo+8], other.src[off:off+8]) {
						errs <- fmt.Errorf("%s round %d: read %x, want %x", me.p.Name(), r, me.dst[lo:lo+8], other.src[off:off+8])
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if ab.l.conns[0].waitFrames.Load() == 0 || ba.l.conns[0].waitFrames.Load() == 0 {
		t.Fatal("no Wait read its connection")
	}
}

// TestWaitHandsOverBulk: a Wait for a small read that holds the socket
// when a large read's answer comes first leaves that answer to the
// reader goroutine (handOver), so that a cancel of the small read ends
// its Wait at once though the large answer's bytes stall; then both
// reads end as they should, the large one with every byte.
func TestWaitHandsOverBulk(t *testing.T) {
	a, err := New(ctxT(t, 10*time.Second), Options{Name: "a", Auth: testAuth(), Channels: 1, Timeout: time.Minute, Heartbeat: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	p, c, rr := fakeTarget(t, a)
	big := make([]byte, 64<<10)
	small := make([]byte, 8)
	br, _ := a.Register("big", big)
	sr, _ := a.Register("small", small)
	fb := p.Read([]Op{{Local: br, Remote: rr, Len: len(big)}})
	hb, _ := nextFrame(t, c)
	fs := p.Read([]Op{{Local: sr, Remote: rr, Len: len(small)}})
	hs, _ := nextFrame(t, c)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	holdLong(p.l.conns[0])
	go func() { done <- fs.Wait(ctx) }()
	time.Sleep(50 * time.Millisecond) // the small read's Wait holds the socket
	want := make([]byte, len(big))
	fill(want, 4)
	// The large answer's header and half its bytes, then a stall.
	resp := hdr(header{kind: kResp, sub: rRead, id: hb.id, a: hb.a})
	resp = append(resp, hdr(header{kind: kData, id: hb.id, payload: uint32(len(want))})...)
	c.Write(append(resp, want[:len(want)/2]...))
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, ErrCancelled) {
			t.Fatalf("the small read's Wait: %v, want ErrCancelled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("the small read's Wait did not end %v after its cancel, the large answer stalled", time.Since(start))
	}
	c.Write(want[len(want)/2:])
	answerRead(c, hs, 9) // late: dropped
	if err := fb.Wait(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(big, want) {
		t.Fatal("the large read's bytes differ")
	}
	if n := p.l.conns[0].handed.Load(); n == 0 {
		t.Fatal("no frame was handed over")
	}
}

// TestCloseWhileWaitReads: Close of the endpoint while a Wait holds the
// connection's socket, inside a frame's header whose bytes stall (the
// Wait waits for the socket alone), ends the Wait at once with ErrClosed,
// and the socket is closed (the peer sees its end).
func TestCloseWhileWaitReads(t *testing.T) {
	a, err := New(ctxT(t, 10*time.Second), Options{Name: "a", Auth: testAuth(), Channels: 1, Timeout: time.Minute, Heartbeat: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	p, c, rr := fakeTarget(t, a)
	dst := make([]byte, 8)
	dr, _ := a.Register("dst", dst)
	f := p.Read([]Op{{Local: dr, Remote: rr, Len: 8}})
	h, _ := nextFrame(t, c)
	done := make(chan error, 1)
	holdLong(p.l.conns[0])
	go func() { done <- f.Wait(context.Background()) }()
	time.Sleep(50 * time.Millisecond)
	// The answer's first 10 bytes.
	c.Write(hdr(header{kind: kResp, sub: rRead, id: h.id, a: h.a})[:10])
	time.Sleep(50 * time.Millisecond)
	if p.l.conns[0].own.Load() != ownWait {
		t.Fatal("the Wait does not hold the socket")
	}
	start := time.Now()
	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("the Wait: %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the Wait did not end after Close")
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Close and the Wait took %v", took)
	}
	// The descriptor is closed (by the Wait, as it gave the socket back),
	// and the fake target reads the socket's end.
	if err := p.l.conns[0].c.SetReadDeadline(time.Time{}); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("the socket's descriptor is open after Close (%v)", err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var b [1 << 10]byte
	for {
		if _, err := c.Read(b[:]); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatal("the endpoint's socket is still open after Close")
			}
			break
		}
	}
}

// TestSilentLinkWhileWaitReads: a link gone silent fails by the heartbeat
// deadline though a Wait holds its socket (the reader goroutine, which
// keeps the deadline, is not reading).
func TestSilentLinkWhileWaitReads(t *testing.T) {
	a, err := New(ctxT(t, 10*time.Second), Options{Name: "a", Auth: testAuth(), Channels: 1, Timeout: time.Minute, Heartbeat: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	p, c, rr := fakeTarget(t, a)
	_ = c // it never writes: no answer, no ping
	dst := make([]byte, 8)
	dr, _ := a.Register("dst", dst)
	cn := p.l.conns[0]
	holdLong(cn)
	start := time.Now()
	held := make(chan bool, 1)
	var why string
	time.AfterFunc(100*time.Millisecond, func() {
		why = fmt.Sprintf("own %d, parks %d, hand-overs %d", cn.own.Load(), cn.waker.parks.Load(), cn.handed.Load())
		held <- cn.own.Load() == ownWait
	})
	err = p.Read([]Op{{Local: dr, Remote: rr, Len: 8}}).Wait(context.Background())
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("%v, want ErrTimeout (the heartbeat)", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the silent link failed after %v", took)
	}
	if !<-held {
		t.Fatalf("the Wait did not hold the socket (%s)", why)
	}
}

// TestReleaseReadsWhatCame: a frame that comes as a Wait gives the socket
// back, after its last look found it empty, is read then (release), not
// left for the next ping: the reader goroutine, woken for it while the
// Wait held the socket, parked again.
func TestReleaseReadsWhatCame(t *testing.T) {
	a, err := New(ctxT(t, 10*time.Second), Options{Name: "a", Auth: testAuth(), Channels: 1, Timeout: time.Minute, Heartbeat: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	p, c, rr := fakeTarget(t, a)
	d1, d2 := make([]byte, 8), make([]byte, 8)
	r1, _ := a.Register("d1", d1)
	r2, _ := a.Register("d2", d2)
	f1 := p.Read([]Op{{Local: r1, Remote: rr, Len: 8}})
	h1, _ := nextFrame(t, c)
	f2 := p.Read([]Op{{Local: r2, Remote: rr, Len: 8}})
	h2, _ := nextFrame(t, c)
	cn := p.l.conns[0]
	var once sync.Once
	testHookRelease = func(got *conn) {
		once.Do(func() {
			if got != cn {
				return
			}
			// f2's answer comes now; the reader goroutine wakes for it,
			// finds the socket held, and parks again.
			m := cn.missed.Load()
			answerRead(c, h2, 8)
			for dl := time.Now().Add(2 * time.Second); cn.missed.Load() == m && time.Now().Before(dl); {
				time.Sleep(time.Millisecond)
			}
		})
	}
	t.Cleanup(func() { testHookRelease = nil })
	holdLong(cn)
	go func() { time.Sleep(20 * time.Millisecond); answerRead(c, h1, 7) }()
	if err := f1.Wait(ctxT(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-f2.Done():
	case <-time.After(3 * time.Second):
		t.Fatal("the answer that came as the Wait gave the socket back was not read")
	}
	if err := f2.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 8)
	fill(want, 8)
	if !bytes.Equal(d2, want) {
		t.Fatalf("read %x, want %x", d2, want)
	}
}

// holdLong makes the next Wait on c that takes its socket hold it for up
// to a minute (its budget), not the default's millisecond, so that a test
// finds it there.
func holdLong(c *conn) {
	c.spin = time.Minute
	// The reader goroutine holds the socket for a moment after the link
	// starts (its first look): a Wait then would park instead.
	time.Sleep(20 * time.Millisecond)
	for dl := time.Now().Add(2 * time.Second); c.own.Load() != ownFree && time.Now().Before(dl); {
		time.Sleep(time.Millisecond)
	}
}
