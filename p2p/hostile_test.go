package p2p

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/auth"
	"github.com/slimego/slimego/internal/testbin"
	"github.com/slimego/slimego/kernels"
	"golang.org/x/sys/unix"
)

// fakeTarget is a hostile peer this endpoint links to: a listener that
// runs the acceptor's handshake and hello for one connection and then
// hands the raw connection to the test, which speaks the protocol (or
// breaks it) itself. e must dial one channel.
func fakeTarget(t *testing.T, e *Endpoint) (*Peer, net.Conn, RemoteRegion) {
	t.Helper()
	addr, got := fakeAcceptor(t, "evil")
	rr := RemoteRegion{Name: "m", ID: 1, Key: 2, Size: 1 << 20}
	p, c := fakeLink(t, ctxT(t, 10*time.Second), e, info{name: "evil", addr: addr, regions: []RemoteRegion{rr}}, got)
	return p, c, rr
}

// fakeLink links e to the fake target that in describes, which hands its
// end of the connection over on got.
func fakeLink(t *testing.T, ctx context.Context, e *Endpoint, in info, got chan net.Conn) (*Peer, net.Conn) {
	t.Helper()
	p, err := e.ConnectInfo(ctx, in.encode())
	if err != nil {
		t.Fatal(err)
	}
	c, ok := <-got
	if !ok {
		t.Fatal("the fake target got no connection")
	}
	t.Cleanup(func() { c.Close() })
	return p, c
}

// fakeAcceptor listens for one connection, runs the acceptor's
// handshake and hello on it, and hands it over on the channel (closed if
// none comes).
func fakeAcceptor(t *testing.T, name string) (string, chan net.Conn) {
	return fakeAcceptorN(t, name, 1)
}

// fakeAcceptorN is fakeAcceptor for a link of n connections.
func fakeAcceptorN(t *testing.T, name string, n int) (string, chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	got := make(chan net.Conn, n)
	go func() {
		for range n {
			c, err := ln.Accept()
			if err != nil {
				close(got)
				return
			}
			k := auth.NewKey(testAuth().Secret, testAuth().Job)
			if auth.Accept(c, k, shakePurpose(name, c.LocalAddr().String()), time.Now().Add(5*time.Second)) != nil {
				c.Close()
				close(got)
				return
			}
			answerHello(c, stOK)
			got <- c
		}
	}()
	return ln.Addr().String(), got
}

// answerHello reads a connector's hello on c and answers it with status
// st (and a heartbeat of 10 s).
func answerHello(c net.Conn, st uint8) {
	var b [HeaderSize + helloFixed + MaxName]byte
	readFull(c, b[:HeaderSize])
	h, _ := decodeHeader(b[:HeaderSize])
	readFull(c, b[HeaderSize:HeaderSize+int(h.payload)])
	ack := header{kind: kHelloAck, status: st, a: 10000}
	ack.put(b[:])
	c.Write(b[:HeaderSize])
}

// helloFrame is a connector's hello: session, channel, channel count, its
// heartbeat in ms, its pid and its name.
func helloFrame(session uint64, ch, n, hbMS, pid uint32, name string) []byte {
	b := hdr(header{kind: kHello, id: session, a: uint64(ch), b: n, payload: uint32(helloFixed + len(name))})
	b = binary.LittleEndian.AppendUint32(b, hbMS)
	b = binary.LittleEndian.AppendUint32(b, pid)
	return append(b, name...)
}

// nextFrame reads the next frame that is not a ping, and its payload.
func nextFrame(t *testing.T, c net.Conn) (header, []byte) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		var b [HeaderSize]byte
		if _, err := readFull(c, b[:]); err != nil {
			t.Fatalf("reading a frame: %v", err)
		}
		h, err := decodeHeader(b[:])
		if err != nil {
			t.Fatal(err)
		}
		p := make([]byte, h.payload)
		if _, err := readFull(c, p); err != nil {
			t.Fatal(err)
		}
		if h.kind != kPing {
			return h, p
		}
	}
}

// sameHostRequest reads the next frame a same-host initiator sends the
// fake target c, first answering the lease request that asks for a
// region whole before a batch's own request: with lease (the region's
// iovec) as its grant, or "not host" when lease is nil (always for a
// lease of GPU memory).
func sameHostRequest(t *testing.T, c net.Conn, lease []byte) header {
	t.Helper()
	for {
		h, _ := nextFrame(t, c)
		if h.kind != kReq || h.sub != rLease && h.sub != rLeaseG {
			return h
		}
		if lease == nil || h.sub == rLeaseG {
			c.Write(hdr(header{kind: kResp, sub: h.sub, id: h.id, status: stNotHost}))
			continue
		}
		c.Write(append(hdr(header{kind: kResp, sub: rLease, id: h.id, b: 1, payload: IovSize}), lease...))
	}
}

// dialHello opens a connection to e as a member of the test job (the
// handshake) and sends hello on it, reading no answer. rcvbuf (0: the
// default) sets the socket's receive buffer first. The socket closes when
// the test ends.
func dialHello(t *testing.T, e *Endpoint, hello []byte, rcvbuf int) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", e.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if rcvbuf > 0 {
		c.(*net.TCPConn).SetReadBuffer(rcvbuf)
	}
	if err := auth.Connect(c, auth.NewKey(testAuth().Secret, testAuth().Job), shakePurpose(e.Name(), e.Addr()), time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	c.Write(hello)
	return c
}

// member is dialHello, then e's answer to the hello, which must accept it.
func member(t *testing.T, e *Endpoint, hello []byte, rcvbuf int) net.Conn {
	t.Helper()
	c := dialHello(t, e, hello, rcvbuf)
	var ack [HeaderSize]byte
	if _, err := readFull(c, ack[:]); err != nil {
		t.Fatal(err)
	}
	if h, err := decodeHeader(ack[:]); err != nil || h.status != stOK {
		t.Fatalf("hello refused: %+v %v", h, err)
	}
	return c
}

// quiet checks that the initiator sends the fake target c no request for
// a while (a transfer copied through a lease asks nothing): only pings,
// and the release of an earlier grant.
func quiet(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	for {
		var b [HeaderSize]byte
		if _, err := readFull(c, b[:]); err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("reading a frame: %v", err)
			}
			return
		}
		if h, err := decodeHeader(b[:]); err != nil || h.kind != kPing && h.kind != kRelease {
			t.Fatalf("got %+v (%v), want nothing", h, err)
		}
	}
}

// TestHelloChannelMismatch: two hellos of one session that disagree on
// the session's channel count (a hostile member's) close the connection;
// the endpoint does not crash and goes on linking.
func TestHelloChannelMismatch(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	b := endpoint(t, ctx, Options{Name: "b", Auth: testAuth()})
	hello := func(ch, n uint32) net.Conn { return dialHello(t, b, helloFrame(99, ch, n, 1000, 0, "evil"), 0) }
	hello(0, 2)
	c := hello(3, 4) // the session has 2 channels: there is no channel 3
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var buf [HeaderSize]byte
	readFull(c, buf[:])
	for { // the connection is closed
		if _, err := c.Read(buf[:]); err != nil {
			break
		}
	}
	a := endpoint(t, ctx, Options{Name: "a", Auth: testAuth()})
	if _, err := a.ConnectInfo(ctx, b.Info()); err != nil {
		t.Fatalf("an honest link after the hostile hellos: %v", err)
	}
}

// TestResponseOfAnotherKind: a peer that answers this side's write as if
// it were a read (a response of another kind, followed by bytes) breaks
// the protocol: the link closes and the write's source is not written.
func TestResponseOfAnotherKind(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	a := endpoint(t, ctx, Options{Name: "a", Auth: testAuth(), Channels: 1})
	p, c, rr := fakeTarget(t, a)
	src := make([]byte, 4096)
	fill(src, 5)
	orig := append([]byte(nil), src...)
	lr, _ := a.Register("src", src)
	f := p.Write([]Op{{Local: lr, Remote: rr, Len: len(src)}})
	h, _ := nextFrame(t, c) // the request
	if h.kind != kReq || h.sub != rWrite {
		t.Fatalf("got %+v, want a write request", h)
	}
	nextFrame(t, c) // its bytes
	c.Write(append(hdr(header{kind: kResp, sub: rRead, id: h.id, a: uint64(len(src))}),
		append(hdr(header{kind: kData, id: h.id, payload: uint32(len(src))}), make([]byte, len(src))...)...))
	err := f.Wait(ctx)
	if !bytes.Equal(src, orig) {
		t.Fatal("the peer's answer wrote into the write's source")
	}
	if err == nil {
		t.Fatal("a write answered as a read succeeded")
	}
}

// TestSendWithoutClearToSend: the bytes of a send that this side never
// cleared (no announcement, no clear-to-send) break the protocol: the
// posted receive fails instead of succeeding with nothing received.
func TestSendWithoutClearToSend(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	a := endpoint(t, ctx, Options{Name: "a", Auth: testAuth(), Channels: 1})
	p, c, _ := fakeTarget(t, a)
	buf := make([]byte, 100)
	f := p.Recv(buf)
	c.Write(append(hdr(header{kind: kReq, sub: rSend, id: 0, a: 100}),
		append(hdr(header{kind: kData, payload: 100}), bytes.Repeat([]byte{7}, 100)...)...))
	if err := f.Wait(ctx); err == nil {
		t.Fatalf("a receive of bytes never cleared succeeded (length %d, buffer %v...)", f.Len(), buf[:4])
	}
}

// TestNilFuture: the methods of a nil Future return an error or a zero
// value; none panics.
func TestNilFuture(t *testing.T) {
	var f *Future
	if err := f.Wait(context.Background()); !errors.Is(err, ErrInvalid) {
		t.Errorf("Wait: %v, want ErrInvalid", err)
	}
	select {
	case <-f.Done():
	default:
		t.Error("Done of a nil Future is not closed")
	}
	if f.Transport() != "" || f.Len() != 0 {
		t.Error("a nil Future has a transport or a length")
	}
}

// TestForgedSameHostInfo: an Info that gives another process's pid (with
// that process's token and its address, which its own published Info
// tells every member) does not make the link same-host: the process at
// the pid must own the link's sockets. Otherwise every grant the peer
// sends would be applied to that process's memory (or, with this
// process's own pid, to this process's memory outside its regions).
func TestForgedSameHostInfo(t *testing.T) {
	addr, st := storeFor(t)
	ctx := ctxT(t, 30*time.Second)
	startChild(t, "plain", addr, 4096, 3)
	vb, err := st.Get(ctx, "p2p/info/child")
	if err != nil {
		t.Fatal(err)
	}
	victim, err := decodeInfo(vb)
	if err != nil {
		t.Fatal(err)
	}
	a := endpoint(t, ctx, Options{Name: "a", Auth: testAuth()})
	m := endpoint(t, ctx, Options{Name: "m", Auth: testAuth()})
	mem := make([]byte, 1<<16)
	fill(mem, 4)
	mr, _ := m.Register("mem", mem)
	forged, err := decodeInfo(m.Info())
	if err != nil {
		t.Fatal(err)
	}
	forged.host, forged.pid, forged.token, forged.tokenAddr = victim.host, victim.pid, victim.token, victim.tokenAddr
	p, err := a.ConnectInfo(ctx, forged.encode())
	if err != nil {
		t.Fatal(err)
	}
	if p.Transport() != "tcp" {
		t.Errorf("a link to %q whose Info names pid %d (another process) is %q", "m", victim.pid, p.Transport())
	}
	lr, _ := a.Register("l", make([]byte, len(mem)))
	f := p.Read([]Op{{Local: lr, Remote: mr.Remote(), Len: len(mem)}})
	if err := f.Wait(ctx); err != nil || !bytes.Equal(lr.Bytes(), mem) {
		t.Fatalf("reading the peer's region over %q: %v (bytes equal: %v)", f.Transport(), err, bytes.Equal(lr.Bytes(), mem))
	}
}

// dupTarget is a peer that answers the first dups hellos with "dup" (it
// makes the link itself: its name is lower) and then accepts; it never
// dials. It returns the peer's Info.
func dupTarget(t *testing.T, name string, dups int) []byte {
	t.Helper()
	k := auth.NewKey(testAuth().Secret, testAuth().Job)
	var hellos atomic.Int32
	addr := testbin.Serve(t, func(c net.Conn) {
		if auth.Accept(c, k, shakePurpose(name, c.LocalAddr().String()), time.Now().Add(5*time.Second)) != nil {
			return
		}
		st := stOK
		if int(hellos.Add(1)) <= dups {
			st = stDup
		}
		answerHello(c, st)
	})
	in := info{name: name, addr: addr}
	return in.encode()
}

// TestConnectPeerNeverDials: a peer that answers "I make the link
// myself" and never does is asked again; while it keeps answering so,
// Connect ends at its deadline with an error that names the peer and
// says what happened.
func TestConnectPeerNeverDials(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	a := endpoint(t, ctx, Options{Name: "a", Auth: testAuth(), Channels: 1})
	// Its own dial failed after it answered "dup" once: the link is made
	// on a later try.
	cctx, cancel := context.WithTimeout(ctx, 8*time.Second)
	defer cancel()
	if _, err := a.ConnectInfo(cctx, dupTarget(t, "0once", 1)); err != nil {
		t.Errorf("a peer that answered dup once and then accepts: %v", err)
	}
	cctx, cancel = context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err := a.ConnectInfo(cctx, dupTarget(t, "0lower", 1<<30))
	var oe *OpError
	if !errors.Is(err, ErrTimeout) || !errors.As(err, &oe) || oe.Peer != "0lower" || !strings.Contains(err.Error(), "never arrived") {
		t.Errorf("a peer that never dials: %v, want ErrTimeout naming the peer and saying its link never arrived", err)
	}
}

// TestLifecycleMisuse: Close and Deregister twice, use after Close,
// zero-length sends and receives: errors or success, never a panic or a
// hang.
func TestLifecycleMisuse(t *testing.T) {
	a, b, ab, ba := pair(t, nil)
	ctx := ctxT(t, 20*time.Second)
	r, err := b.Register("r", make([]byte, 64))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Deregister(ctx, r); err != nil {
		t.Fatal(err)
	}
	if err := b.Deregister(ctx, r); err != nil {
		t.Fatalf("a second Deregister: %v", err)
	}
	if err := b.Deregister(ctx, nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Deregister(nil): %v", err)
	}
	// Zero-length messages.
	fs := ab.Send(nil)
	fr := ba.Recv(nil)
	if err := fr.Wait(ctx); err != nil || fr.Len() != 0 {
		t.Fatalf("an empty receive: %v, length %d", err, fr.Len())
	}
	if err := fs.Wait(ctx); err != nil {
		t.Fatalf("an empty send: %v", err)
	}
	lr, _ := a.Register("l", make([]byte, 64))
	tr, _ := b.Register("t", make([]byte, 64))
	pending := ab.Recv(make([]byte, 8))
	a.Close()
	if err := a.Close(); err != nil {
		t.Fatalf("a second Close: %v", err)
	}
	if err := pending.Wait(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("a receive pending at Close: %v", err)
	}
	for name, f := range map[string]*Future{
		"read":     ab.Read([]Op{{Local: lr, Remote: tr.Remote(), Len: 8}}),
		"writeimm": ab.WriteWithImm([]Op{{Local: lr, Remote: tr.Remote(), Len: 8}}, 1),
		"send":     ab.Send([]byte{1}),
		"recv":     ab.Recv(make([]byte, 1)),
	} {
		if err := f.Wait(ctx); !errors.Is(err, ErrClosed) || !isOp(err, name, "b") {
			t.Errorf("%s after Close: %v, want ErrClosed of op %s naming the peer", name, err, name)
		}
	}
	if err := a.Publish(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Publish after Close: %v, want ErrClosed", err)
	}
	if _, err := a.Register("x", make([]byte, 8)); !errors.Is(err, ErrClosed) {
		t.Errorf("Register after Close: %v", err)
	}
	if err := a.Deregister(ctx, lr); err != nil {
		t.Errorf("Deregister after Close: %v", err)
	}
	if _, err := a.Imm(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Imm after Close: %v", err)
	}
	if _, err := a.ConnectInfo(ctx, b.Info()); !errors.Is(err, ErrClosed) {
		t.Errorf("ConnectInfo after Close: %v", err)
	}
	if _, err := a.Connect(ctx, "b"); !errors.Is(err, ErrClosed) {
		t.Errorf("Connect after Close: %v", err)
	}
}

// TestDeregisterDuringWrite: Deregister while a peer's write is being
// received into the region returns once the write has stopped touching
// the region (at its next chunk), without waiting for the rest of the
// peer's bytes, which are read to nowhere; the peer is refused.
func TestDeregisterDuringWrite(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	b := endpoint(t, ctx, Options{Name: "b", Auth: testAuth(), Heartbeat: 20 * time.Second})
	mem := make([]byte, 3*ChunkMax)
	r, _ := b.Register("m", mem)
	rr := r.Remote()
	c := member(t, b, helloFrame(5, 0, 1, 20000, uint32(os.Getpid()), "peer1"), 0)
	p := make([]byte, stripeSize+DescSize)
	(&desc{rr.ID, rr.Key, 0, uint64(len(mem))}).put(p[stripeSize:])
	chunk := bytes.Repeat([]byte{9}, ChunkMax)
	c.Write(append(hdr(header{kind: kReq, sub: rWrite, id: 1, a: uint64(len(mem)), b: 1, payload: uint32(len(p))}), p...))
	c.Write(append(hdr(header{kind: kData, id: 1, payload: ChunkMax}), chunk...))
	done := make(chan error, 1)
	go func() {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		done <- b.Deregister(dctx, r)
	}()
	eventually(t, "Deregister to start", r.closed.Load)
	// The second chunk finds the region gone; the third never comes.
	c.Write(append(hdr(header{kind: kData, id: 1, payload: ChunkMax}), chunk...))
	if err := <-done; err != nil {
		t.Fatalf("Deregister during a stalled write: %v", err)
	}
	if bytes.Count(mem, []byte{9}) > ChunkMax {
		t.Fatal("the write went on into the deregistered region")
	}
	if h, _ := nextFrame(t, c); h.kind != kResp || h.status != stNoRegion {
		t.Fatalf("the writer got %+v, want a refusal", h)
	}
}

// TestCloseDuringTransfers: both endpoints closed while reads, writes,
// immediates, sends and receives of every size are in flight and more are
// being started: every Wait returns (nil or an error), nothing panics,
// and the endpoints' goroutines end.
func TestCloseDuringTransfers(t *testing.T) { transports(t, testCloseDuringTransfers) }

func testCloseDuringTransfers(t *testing.T, tcpOnly bool, _ string) {
	a, b, ab, ba := pair(t, func(o *Options) { o.TCPOnly = tcpOnly; o.Channels = 3 })
	ctx := ctxT(t, 30*time.Second)
	// Each direction has its own local and target regions, and each kind
	// of operation its own range of them: only this package's handling
	// of the memory can race.
	la, _ := a.Register("l", make([]byte, 16<<20))
	ta, _ := a.Register("t", make([]byte, 16<<20))
	lb, _ := b.Register("l", make([]byte, 16<<20))
	tb, _ := b.Register("t", make([]byte, 16<<20))
	var wg sync.WaitGroup
	stop := make(chan struct{})
	start := func(p *Peer, local *Region, remote RemoteRegion, seed int) {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			n := 1 + (i*7919+seed)%(3<<20)
			ops := func(at int) []Op {
				return []Op{{Local: local, LocalOff: at, Remote: remote, RemoteOff: at, Len: n},
					{Local: local, LocalOff: at + 3<<20, Remote: remote, RemoteOff: at + 3<<20, Len: 1 + i%4096}}
			}
			fs := []*Future{p.Read(ops(0)), p.Write(ops(4 << 20)), p.WriteWithImm(ops(8<<20), uint32(i)), p.Send(make([]byte, n%5000)), p.Recv(make([]byte, 5000))}
			for j, f := range fs {
				if j == i%len(fs) { // some are given up
					c, cancel := context.WithCancel(ctx)
					cancel()
					f.Wait(c)
				}
			}
			for _, f := range fs {
				if err := f.Wait(ctx); err != nil && ctx.Err() != nil {
					t.Errorf("a Wait ended only at the test's deadline: %v", err)
					return
				}
			}
		}
	}
	wg.Add(2)
	go start(ab, la, tb.Remote(), 1)
	go start(ba, lb, ta.Remote(), 2)
	time.Sleep(200 * time.Millisecond)
	var cw sync.WaitGroup
	cw.Add(2)
	go func() { defer cw.Done(); a.Close() }()
	go func() { defer cw.Done(); b.Close() }()
	cw.Wait()
	close(stop)
	wg.Wait()
	eventually(t, "the endpoints' goroutines to end", func() bool { return p2pGoroutines() == 0 })
}

// p2pGoroutines counts the goroutines running this package's code (the
// test's own aside).
func p2pGoroutines() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "slimego/p2p.") && !strings.Contains(g, "p2p.Test") && !strings.Contains(g, "p2p.test") && !strings.Contains(g, "p2p.transports") {
			n++
		}
	}
	return n
}

// TestGrantsBounded: a member that asks for same-host grants and never
// releases them holds at most maxGrants of them; past that its requests
// are answered "not host memory" (an honest initiator then asks again
// over TCP), so that it cannot make the target hold memory without end.
func TestGrantsBounded(t *testing.T) {
	setLimit(t, &maxGrants, 1<<10)
	ctx := ctxT(t, 60*time.Second)
	b, err := New(ctx, Options{Name: "b", Auth: testAuth()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	r, _ := b.Register("m", make([]byte, 4096))
	rr := r.Remote()
	c := member(t, b, helloFrame(5, 0, 1, 20000, uint32(os.Getpid()), "peer1"), 0)
	n := maxGrants + 1000
	go func() {
		p := make([]byte, stripeSize+DescSize)
		(&desc{rr.ID, rr.Key, 0, 1}).put(p[stripeSize:])
		var batch []byte
		for id := range uint64(n) {
			batch = append(batch, hdr(header{kind: kReq, sub: rReadV, id: id + 1, a: 1, b: 1, payload: uint32(len(p))})...)
			batch = append(batch, p...)
			if len(batch) > 1<<20 || id == uint64(n-1) {
				if _, err := c.Write(batch); err != nil {
					return
				}
				batch = batch[:0]
			}
		}
	}()
	granted, notHost := 0, 0
	for granted+notHost < n {
		h, _ := nextFrame(t, c)
		switch {
		case h.kind == kResp && h.status == stOK:
			granted++
		case h.kind == kResp && h.status == stNotHost:
			notHost++
		default:
			t.Fatalf("got %+v", h)
		}
	}
	if granted > maxGrants || notHost == 0 {
		t.Fatalf("%d grants held by a peer that releases none (at most %d), %d answered not host", granted, maxGrants, notHost)
	}
}

// TestAnswersBounded: a member that sends requests and never reads the
// answers has its link closed once maxQueued answers wait on one
// connection, instead of making the target queue them without end until
// the heartbeat (which a peer that reads a little now and then never
// reaches).
func TestAnswersBounded(t *testing.T) {
	setLimit(t, &maxQueued, 1<<10)
	ctx := ctxT(t, 60*time.Second)
	b, err := New(ctx, Options{Name: "b", Auth: testAuth(), Heartbeat: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// Reads of 64 KiB: the target's socket buffers hold the answers of a
	// few hundred, and the rest wait in its queue.
	const size = 64 << 10
	r, _ := b.Register("m", make([]byte, size))
	rr := r.Remote()
	c := member(t, b, helloFrame(5, 0, 1, 120000, 0, "peer1"), 4096)
	p := make([]byte, stripeSize+DescSize)
	(&desc{rr.ID, rr.Key, 0, size}).put(p[stripeSize:])
	eventually(t, "the link", func() bool { return b.Peer("peer1") != nil })
	var batch []byte
	n := 16 * uint64(maxQueued)
	for id := uint64(1); id <= n; id++ {
		batch = append(batch, hdr(header{kind: kReq, sub: rRead, id: id, a: size, b: 1, payload: uint32(len(p))})...)
		batch = append(batch, p...)
		if len(batch) < 4<<10 && id < n {
			continue
		}
		c.SetWriteDeadline(time.Now().Add(30 * time.Second))
		if _, err := c.Write(batch); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("after %d requests the target stopped reading them and kept the link", id)
			}
			break // the target closed the link
		}
		batch = batch[:0]
	}
	eventually(t, "the target to close the link of a peer that does not read its answers", func() bool { return b.Peer("peer1") == nil })
}

// TestGrantOutlivesLink: a same-host grant the peer has not released when
// the link fails may still be copied through (the peer's copy stops only
// when it notices): Deregister does not return nil at once as if nothing
// touched the region; the grant's hold ends a heartbeat after the link.
func TestGrantOutlivesLink(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	b := endpoint(t, ctx, Options{Name: "b", Auth: testAuth(), Heartbeat: 20 * time.Second})
	r, _ := b.Register("m", make([]byte, 4096))
	rr := r.Remote()
	c := member(t, b, helloFrame(5, 0, 1, 20000, uint32(os.Getpid()), "peer1"), 0)
	p := make([]byte, stripeSize+DescSize)
	(&desc{rr.ID, rr.Key, 0, 4096}).put(p[stripeSize:])
	c.Write(append(hdr(header{kind: kReq, sub: rWriteV, id: 1, a: 4096, b: 1, payload: uint32(len(p))}), p...))
	if h, _ := nextFrame(t, c); h.kind != kResp || h.status != stOK {
		t.Fatalf("got %+v, want a grant", h)
	}
	// Now the link fails (a malformed frame) with the grant held.
	c.Write(bytes.Repeat([]byte{0xff}, HeaderSize))
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		var buf [HeaderSize]byte
		if _, err := c.Read(buf[:]); err != nil {
			break
		}
	}
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var oe *OpError
	if err := b.Deregister(dctx, r); !errors.Is(err, ErrTimeout) || !errors.As(err, &oe) || oe.Peer != "peer1" {
		t.Fatalf("Deregister with a grant outstanding when the link failed: %v, want ErrTimeout naming peer1, which holds it", err)
	}
}

// TestRecvCancelledAfterClear: a receive given up after it cleared the
// send, before the bytes came, answers the sender "cancelled" when they
// come (the sender would otherwise wait for an answer until its
// deadline).
func TestRecvCancelledAfterClear(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	a := endpoint(t, ctx, Options{Name: "a", Auth: testAuth(), Channels: 1})
	p, c, _ := fakeTarget(t, a)
	buf := make([]byte, 100)
	f := p.Recv(buf)
	c.Write(hdr(header{kind: kReq, sub: rRTS, id: 0, a: 100}))
	if h, _ := nextFrame(t, c); h.kind != kReq || h.sub != rCTS || h.status != stOK {
		t.Fatalf("got %+v, want clear-to-send", h)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := f.Wait(cctx); !errors.Is(err, ErrCancelled) {
		t.Fatalf("the cancelled receive: %v", err)
	}
	c.Write(append(hdr(header{kind: kReq, sub: rSend, id: 0, a: 100}),
		append(hdr(header{kind: kData, payload: 100}), bytes.Repeat([]byte{7}, 100)...)...))
	if h, _ := nextFrame(t, c); h.kind != kResp || h.sub != rSend || h.status != stCancelled {
		t.Fatalf("the sender got %+v, want the send's answer, cancelled", h)
	}
	if !bytes.Equal(buf, make([]byte, 100)) {
		t.Fatal("the bytes landed in the cancelled receive's buffer")
	}
}

// TestDuplicateAnnouncement: a send announced twice (a hostile peer's)
// breaks the protocol: the link closes rather than the cleared receive
// being matched again to another length.
func TestDuplicateAnnouncement(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	a := endpoint(t, ctx, Options{Name: "a", Auth: testAuth(), Channels: 1})
	p, c, _ := fakeTarget(t, a)
	f := p.Recv(make([]byte, 100))
	c.Write(hdr(header{kind: kReq, sub: rRTS, id: 0, a: 100}))
	if h, _ := nextFrame(t, c); h.kind != kReq || h.sub != rCTS || h.status != stOK {
		t.Fatalf("got %+v, want clear-to-send", h)
	}
	c.Write(hdr(header{kind: kReq, sub: rRTS, id: 0, a: 10}))
	if err := f.Wait(ctx); !errors.Is(err, ErrPeerLost) {
		t.Fatalf("a receive whose send was announced twice: %v, want ErrPeerLost", err)
	}
}

// TestProcAddr: addresses as /proc/net/tcp and tcp6 print them (32-bit
// words in the host's order, here little-endian), and junk refused.
func TestProcAddr(t *testing.T) {
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		t.Skip("the examples are a little-endian host's")
	}
	for in, want := range map[string]string{
		"0100007F:1F90":                         "127.0.0.1:8080",
		"0000000000000000FFFF00000100007F:1F90": "127.0.0.1:8080",
		"00000000000000000000000001000000:0050": "[::1]:80",
	} {
		got, err := procAddr(in)
		if err != nil || got.String() != want {
			t.Errorf("procAddr(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	for _, bad := range []string{"", ":", "0100007F", "0100007F:", "0100007G:0050", "0100007F:10000", "01007F:0050", "0100007F:0050:1"} {
		if a, err := procAddr(bad); err == nil {
			t.Errorf("procAddr(%q) = %v, want an error", bad, a)
		}
	}
}

// TestRandomFrames: members send sequences of well-formed frames of every
// kind with random fields (requests in and out of bounds, with right and
// wrong keys, answers and data for ids in use and not, releases,
// cancels) while the endpoint has transfers of its own to them in
// flight: nothing panics or races, every Wait returns, and the endpoint
// serves its honest peer afterwards.
func TestRandomFrames(t *testing.T) {
	_, b, ab, _ := pair(t, func(o *Options) { o.Channels = 2 })
	const seed = 1
	a := ab.e
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx := ctxT(t, 120*time.Second)
	mem := make([]byte, 1<<16)
	r, _ := b.Register("m", mem)
	rr := r.Remote()
	la, _ := a.Register("l", make([]byte, 1<<16))
	k := auth.NewKey(testAuth().Secret, testAuth().Job)
	rng := rand.New(rand.NewPCG(seed, 2))
	subs := []uint8{rRead, rWrite, rImm, rRTS, rCTS, rSend, rReadV, rWriteV}
	for round := range 100 {
		c, err := net.Dial("tcp", b.Addr())
		if err != nil {
			t.Fatal(err)
		}
		auth.Connect(c, k, shakePurpose(b.Name(), b.Addr()), time.Now().Add(5*time.Second))
		nch := uint32(1 + rng.IntN(2))
		c.Write(helloFrame(uint64(round+1000), 0, nch, 20000, uint32(os.Getpid()), "evil"+string(rune('a'+round%26))))
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 1<<16)
			for {
				c.SetReadDeadline(time.Now().Add(2 * time.Second))
				if _, err := c.Read(buf); err != nil {
					return
				}
			}
		}()
		name := "evil" + string(rune('a'+round%26))
		var pb *Peer
		for range 100 {
			if pb = b.Peer(name); pb != nil {
				break
			}
			time.Sleep(time.Millisecond)
		}
		lb, _ := b.Register("lb", make([]byte, 1<<16))
		if pb != nil {
			fake := RemoteRegion{Name: "x", ID: 1, Key: 2, Size: 1 << 16}
			ops := []Op{{Local: lb, Remote: fake, Len: 1 + rng.IntN(1<<16)}}
			fs := []*Future{pb.Read(ops), pb.Write(ops), pb.WriteWithImm(ops, 3), pb.Send(make([]byte, 50)), pb.Recv(make([]byte, 50)), pb.Read(ops)}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for _, f := range fs {
					cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
					f.Wait(cctx)
					cancel()
				}
				b.Deregister(ctx, lb)
			}()
		}
		var out []byte
		for range 50 {
			var h header
			var pay []byte
			switch rng.IntN(8) {
			case 0, 1, 2:
				sub := subs[rng.IntN(len(subs))]
				h = header{kind: kReq, sub: sub, id: uint64(rng.IntN(8))}
				switch sub {
				case rRead, rWrite, rReadV, rWriteV:
					n := 1 + rng.IntN(3)
					pay = make([]byte, stripeSize+n*DescSize)
					var sum uint64
					for i := range n {
						d := desc{rr.ID, rr.Key, uint64(rng.IntN(1 << 16)), uint64(1 + rng.IntN(1<<12))}
						if rng.IntN(4) == 0 {
							d.key ^= 1
						}
						sum += d.len
						d.put(pay[stripeSize+i*DescSize:])
					}
					lo := uint64(rng.IntN(int(sum)))
					pay[0] = byte(lo)
					pay[1] = byte(lo >> 8)
					h.a = sum - lo
					h.b = uint32(n)
				case rImm:
					h.a = uint64(rng.Uint32())
				case rRTS, rSend:
					h.a = uint64(rng.IntN(100))
				case rCTS:
					h.status = uint8(rng.IntN(3)) * stCancelled / 2
				}
			case 3:
				h = header{kind: kData, id: uint64(rng.IntN(8)), payload: uint32(1 + rng.IntN(5000))}
				pay = make([]byte, h.payload)
			case 4:
				h = header{kind: kResp, sub: subs[rng.IntN(len(subs))], id: uint64(rng.IntN(8)), status: uint8(rng.IntN(3))}
				if h.sub == rRead && h.status == 0 {
					h.a = uint64(rng.IntN(1 << 16))
				}
				if (h.sub == rReadV || h.sub == rWriteV) && h.status == 0 {
					h.b = 1
					pay = make([]byte, IovSize)
				}
			case 5:
				h = header{kind: kEnd, id: uint64(rng.IntN(8)), status: 1 + uint8(rng.IntN(5))}
			case 6:
				h = header{kind: kRelease, id: uint64(rng.IntN(8))}
			case 7:
				h = header{kind: kCancel, id: uint64(rng.IntN(8))}
			}
			h.payload = uint32(len(pay))
			if _, err := decodeHeader(hdr(h)); err != nil {
				continue
			}
			out = append(out, hdr(h)...)
			out = append(out, pay...)
		}
		c.Write(out)
		time.Sleep(5 * time.Millisecond)
		c.Close()
	}
	if err := ab.Read([]Op{{Local: la, Remote: rr, Len: 1 << 16}}).Wait(ctx); err != nil {
		t.Fatal(err)
	}
}

// openFDs counts this process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd:", err)
	}
	return len(fds)
}

// TestNoFDLeak: an endpoint linked to a child process (over TCP, and on
// the same host with its pidfd), with transfers done and given up, holds
// no descriptor once closed.
func TestNoFDLeak(t *testing.T) { transports(t, testNoFDLeak) }

func testNoFDLeak(t *testing.T, tcpOnly bool, wantT string) {
	addr, st := storeFor(t)
	ctx := ctxT(t, 30*time.Second)
	startChild(t, "plain", addr, 8<<20, 9)
	before := openFDs(t)
	a, err := New(ctx, Options{Name: "parent", Store: st, Auth: testAuth(), TCPOnly: tcpOnly})
	if err != nil {
		t.Fatal(err)
	}
	p, err := a.Connect(ctx, "child")
	if err != nil {
		t.Fatal(err)
	}
	if p.Transport() != wantT {
		t.Fatalf("transport %q, want %q", p.Transport(), wantT)
	}
	rr, _ := p.Remote("mem")
	lr, _ := a.Register("l", make([]byte, 8<<20))
	for i := range 20 {
		f := p.Read([]Op{{Local: lr, Remote: rr, Len: 8 << 20}})
		if i%2 == 1 {
			c, cancel := context.WithCancel(ctx)
			cancel()
			f.Wait(c)
		}
		f.Wait(ctx)
	}
	a.Close()
	eventually(t, "the endpoint's descriptors to close", func() bool { return openFDs(t) <= before })
}

// TestHandshakesBounded: connections that never prove themselves (no
// secret needed to open them) hold at most maxHandshakes handshakes at
// once; the others wait in the kernel's backlog.
func TestHandshakesBounded(t *testing.T) {
	setLimit(t, &maxHandshakes, 4)
	ctx := ctxT(t, 30*time.Second)
	b, err := New(ctx, Options{Name: "b", Auth: testAuth(), HandshakeTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	greets := func() int {
		buf := make([]byte, 1<<20)
		return strings.Count(string(buf[:runtime.Stack(buf, true)]), "p2p.(*Endpoint).greet(")
	}
	for range 3 * maxHandshakes {
		c, err := net.Dial("tcp", b.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	eventually(t, "the handshakes to start", func() bool { return greets() >= maxHandshakes })
	for range 50 {
		if n := greets(); n > maxHandshakes {
			t.Fatalf("%d handshakes at once, at most %d", n, maxHandshakes)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// uffdRegion maps n bytes whose pages are missing until the returned
// function is called: a process_vm copy from them blocks until then
// (userfaultfd). It skips the test where userfaultfd is not allowed.
func uffdRegion(t *testing.T, n int) ([]byte, func()) {
	t.Helper()
	mem, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	fd, _, e := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK, 0, 0)
	if e != 0 {
		unix.Munmap(mem)
		t.Skip("userfaultfd:", e)
	}
	const uffdioAPI, uffdioRegister, modeMissing = 0xc018aa3f, 0xc020aa00, 1
	api := [3]uint64{0xAA, 0, 0}
	reg := [4]uint64{uint64(uintptr(unsafe.Pointer(&mem[0]))), uint64(n), modeMissing, 0}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, fd, uffdioAPI, uintptr(unsafe.Pointer(&api))); e != 0 {
		t.Skip("userfaultfd api:", e)
	}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, fd, uffdioRegister, uintptr(unsafe.Pointer(&reg))); e != 0 {
		t.Skip("userfaultfd register:", e)
	}
	var once sync.Once
	release := func() { once.Do(func() { unix.Close(int(fd)) }) } // the faults then resolve to zero pages
	// The mapping is never unmapped: a copy of this test still held up
	// in the kernel when it ends (by design, Close and Deregister return
	// first) goes on once its pages come, and retries a short copy; had
	// the range been unmapped and mapped again by the next test before
	// its registration, the stale copy's read would fault in zero pages
	// there, and the next test's copy would find its pages present and
	// not wait. 64 KiB per test.
	t.Cleanup(release)
	return mem, release
}

// uffdTarget is a fake same-host target (c, its end of a one-connection
// link p of endpoint a) whose region rr, of 64 KiB, is memory that a
// userfaultfd holds back until pages is called; iov grants it whole, and
// lr is a's local region of the same size.
type uffdTarget struct {
	ctx   context.Context
	a     *Endpoint
	p     *Peer
	c     net.Conn
	lr    *Region
	rr    RemoteRegion
	iov   []byte
	pages func()
}

func newUffdTarget(t *testing.T) uffdTarget {
	t.Helper()
	return newUffdTargetOpts(t, Options{Name: "a", Auth: testAuth(), Channels: 1})
}

// newUffdTargetOpts is newUffdTarget with a's Options.
func newUffdTargetOpts(t *testing.T, opts Options) uffdTarget {
	t.Helper()
	ctx := ctxT(t, 30*time.Second)
	a := endpoint(t, ctx, opts)
	src, pages := uffdRegion(t, 1<<16)
	rr := RemoteRegion{Name: "m", ID: 1, Key: 2, Size: 1 << 16}
	p, c := fakeSameHostTarget(t, ctx, a, rr)
	lr, _ := a.Register("l", make([]byte, 1<<16))
	iov := make([]byte, IovSize)
	binary.LittleEndian.PutUint64(iov, uint64(uintptr(unsafe.Pointer(&src[0]))))
	binary.LittleEndian.PutUint64(iov[8:], 1<<16)
	return uffdTarget{ctx: ctx, a: a, p: p, c: c, lr: lr, rr: rr, iov: iov, pages: pages}
}

// TestCopyDoesNotBlockReader: a same-host copy that blocks (here on pages
// a userfaultfd holds back) does not keep the connection's reader from
// reading: an immediate that comes meanwhile on the same connection is
// delivered, and the read completes once its pages come.
func TestCopyDoesNotBlockReader(t *testing.T) {
	u := newUffdTarget(t)
	ctx, a, p, c, lr, rr, iov, pages := u.ctx, u.a, u.p, u.c, u.lr, u.rr, u.iov, u.pages
	// Larger than cmaMin: smaller batches go over TCP.
	f := p.Read([]Op{{Local: lr, Remote: rr, Len: 1 << 16}})
	h := sameHostRequest(t, c, nil)
	if h.kind != kReq || h.sub != rReadV {
		t.Fatalf("got %+v, want a same-host read", h)
	}
	c.Write(append(hdr(header{kind: kResp, sub: rReadV, id: h.id, b: 1, payload: IovSize}), iov...))
	c.Write(hdr(header{kind: kReq, sub: rImm, id: 99, a: 7}))
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	im, err := a.Imm(ictx)
	pages()
	if err != nil || im.Value != 7 {
		t.Fatalf("an immediate while a copy waits for its pages: %v %v", im, err)
	}
	if err := f.Wait(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestGrantNeedsHolder: a same-host request from a member whose hello
// gives a pid that does not hold the link's socket (a member on another
// host, or one that lies) is answered "not host memory", which an honest
// initiator takes over TCP: the target's addresses are granted only to a
// process on this host that can copy through them. One that tells the
// truth is granted.
func TestGrantNeedsHolder(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	b := endpoint(t, ctx, Options{Name: "b", Auth: testAuth()})
	r, _ := b.Register("m", make([]byte, 4096))
	rr := r.Remote()
	for _, tc := range []struct {
		pid  uint32
		want uint8
	}{{1, stNotHost}, {uint32(os.Getpid()), stOK}} {
		c := member(t, b, helloFrame(uint64(tc.pid), 0, 1, 20000, tc.pid, fmt.Sprint("pid", tc.pid)), 0)
		p := make([]byte, stripeSize+DescSize)
		(&desc{rr.ID, rr.Key, 0, 4096}).put(p[stripeSize:])
		c.Write(append(hdr(header{kind: kReq, sub: rReadV, id: 1, a: 4096, b: 1, payload: uint32(len(p))}), p...))
		if h, _ := nextFrame(t, c); h.kind != kResp || h.status != tc.want {
			t.Errorf("a same-host read from a member whose hello says pid %d: %+v, want status %d", tc.pid, h, tc.want)
		}
	}
}

// fakeSameHostTarget links a, an endpoint of this process, to a raw
// target in this process whose Info says so truthfully (it holds the
// link's socket), so that the link is same-host; it returns the peer and
// the target's end of the connection.
func fakeSameHostTarget(t *testing.T, ctx context.Context, a *Endpoint, rr RemoteRegion) (*Peer, net.Conn) {
	t.Helper()
	p, cs := fakeSameHostTargetN(t, ctx, a, []RemoteRegion{rr}, 1)
	return p, cs[0]
}

// fakeSameHostTargetN is fakeSameHostTarget with the regions given, for
// an endpoint whose links have n connections; it returns them all.
func fakeSameHostTargetN(t *testing.T, ctx context.Context, a *Endpoint, regions []RemoteRegion, n int) (*Peer, []net.Conn) {
	t.Helper()
	addr, got := fakeAcceptorN(t, "t", n)
	in := info{name: "t", addr: addr, host: a.host, pid: uint32(os.Getpid()), token: *a.token,
		tokenAddr: uint64(uintptr(unsafe.Pointer(a.token))), regions: regions}
	p, c := fakeLink(t, ctx, a, in, got)
	cs := []net.Conn{c}
	for range n - 1 {
		c, ok := <-got
		if !ok {
			t.Fatal("the fake target got too few connections")
		}
		t.Cleanup(func() { c.Close() })
		cs = append(cs, c)
	}
	if p.Transport() != "cma" {
		t.Fatalf("transport %q, want cma", p.Transport())
	}
	return p, cs
}

// sameHostInitiator is an endpoint "a" of one connection, closed when
// the test ends, linked to a fake same-host target (c, its end of the
// connection) that lists a region "m" of size bytes, rr; ctx bounds the
// test.
func sameHostInitiator(t *testing.T, size uint64) (context.Context, *Endpoint, *Peer, net.Conn, RemoteRegion) {
	t.Helper()
	ctx := ctxT(t, 20*time.Second)
	a := endpoint(t, ctx, Options{Name: "a", Auth: testAuth(), Channels: 1})
	rr := RemoteRegion{Name: "m", ID: 1, Key: 2, Size: size}
	p, c := fakeSameHostTarget(t, ctx, a, rr)
	return ctx, a, p, c, rr
}

// grantIovec is a granted iovec (see rReadV) of the memory at b, whole:
// in memory mem (0: plain memory) at off, its file at fd.
func grantIovec(b []byte, mem, off uint64, fd uint32) []byte {
	iov := make([]byte, IovSize)
	binary.LittleEndian.PutUint64(iov, uint64(uintptr(unsafe.Pointer(&b[0]))))
	binary.LittleEndian.PutUint64(iov[8:], uint64(len(b)))
	binary.LittleEndian.PutUint64(iov[16:], mem)
	binary.LittleEndian.PutUint64(iov[24:], off)
	binary.LittleEndian.PutUint32(iov[32:], fd)
	return iov
}

// TestSharedGrantChecked: a same-host grant that names Shared memory is
// mapped only if the file it names is a memory file sealed against
// shrinking, or a regular file on the tmpfs at this process's /dev/shm, and
// large enough; otherwise the initiator copies at the grant's address, which
// the kernel checks against the peer's memory. A malformed entry fails
// the link. Every case reads the right bytes or fails; none crashes.
func TestSharedGrantChecked(t *testing.T) {
	const n = 1 << 16
	good, err := NewShared(n)
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	fill(good.Bytes(), 3)
	small, err := NewShared(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	fill(small.Bytes(), 4)
	unsealed, err := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(unsealed)
	unix.Ftruncate(unsealed, n)
	plain := make([]byte, n)
	fill(plain, 5)
	disk, err := os.CreateTemp(t.TempDir(), "notmem")
	if err != nil {
		t.Fatal(err)
	}
	defer disk.Close()
	disk.Truncate(n)
	// Files in /dev/shm (intra's symmetric memory is one): unsealed, so
	// mapped only because they are on the tmpfs at this process's /dev/shm.
	devShm := func(size int64) *os.File {
		f, err := os.CreateTemp("/dev/shm", "slimego-p2ptest-")
		if err != nil {
			t.Skip("no /dev/shm:", err)
		}
		os.Remove(f.Name())
		t.Cleanup(func() { f.Close() })
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
		return f
	}
	inShm, err := MapShared(int(devShm(8192+n).Fd()), 8192, n)
	if err != nil {
		t.Fatal(err)
	}
	defer inShm.Close()
	fill(inShm.Bytes(), 6)
	shortShm := devShm(n / 2)
	// A tmpfs of its own (root only): tmpfs, but not this process's
	// /dev/shm (a peer's own file system, not one this process shares).
	other := plain
	otherFD := uint32(1 << 30)
	if mnt := t.TempDir(); unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m") == nil {
		t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
		f, err := os.Create(mnt + "/mem")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		f.Truncate(n)
		otherFD = uint32(f.Fd())
	} else {
		t.Log("no tmpfs of its own (not root): that case reads a descriptor that is not there")
	}
	dir, err := os.Open("/dev/shm")
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	for _, tc := range []struct {
		name      string
		addr      []byte // the grant's address: the bytes the read must return
		mem, off  uint64
		fd        uint32
		transport string
		bad       bool
	}{
		{"shared", good.Bytes(), good.id, 0, uint32(good.fd), "shm", false},
		{"an unsealed memory file", plain, 77, 0, uint32(unsealed), "cma", false},
		{"a file on disk", plain, 79, 0, uint32(disk.Fd()), "cma", false},
		{"a file in /dev/shm", inShm.Bytes(), inShm.id, 8192, uint32(inShm.fd), "shm", false},
		{"a file in /dev/shm smaller than the grant", plain, 80, 0, uint32(shortShm.Fd()), "cma", false},
		{"the directory /dev/shm", plain, 81, 0, uint32(dir.Fd()), "cma", false},
		{"a file on another tmpfs", other, 82, 0, otherFD, "cma", false},
		{"a file smaller than the grant", plain, small.id, 0, uint32(small.fd), "cma", false},
		{"an offset past the file", plain, good.id + 1, n, uint32(good.fd), "cma", false},
		{"a file that is not there", plain, 78, 0, 1 << 30, "cma", false},
		{"an fd for plain memory", plain, 0, 0, 3, "", true},
		{"an offset for plain memory", plain, 0, 8, 0, "", true},
	} {
		// Each as the grant of one read, and as a lease of the region
		// whole, through which a second read then copies asking nothing.
		for _, leased := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/leased=%v", tc.name, leased), func(t *testing.T) {
				ctx, a, p, c, rr := sameHostInitiator(t, n)
				local := make([]byte, n)
				lr, _ := a.Register("l", local)
				iov := grantIovec(tc.addr, tc.mem, tc.off, tc.fd)
				f := p.Read([]Op{{Local: lr, Remote: rr, Len: n}})
				if leased && tc.bad {
					if h, _ := nextFrame(t, c); h.kind != kReq || h.sub != rLease {
						t.Fatalf("got %+v, want a lease request", h)
					}
					c.Write(append(hdr(header{kind: kResp, sub: rLease, id: 0, b: 1, payload: IovSize}), iov...))
					if err := f.Wait(ctx); !errors.Is(err, ErrPeerLost) {
						t.Fatalf("a malformed lease: %v, want ErrPeerLost", err)
					}
					return
				}
				var lease []byte
				if leased {
					lease = iov
				}
				h := sameHostRequest(t, c, lease)
				if h.kind != kReq || h.sub != rReadV {
					t.Fatalf("got %+v, want a same-host read", h)
				}
				c.Write(append(hdr(header{kind: kResp, sub: rReadV, id: h.id, b: 1, payload: IovSize}), iov...))
				err = f.Wait(ctx)
				if tc.bad {
					if !errors.Is(err, ErrPeerLost) {
						t.Fatalf("a malformed grant: %v, want ErrPeerLost", err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if f.Transport() != tc.transport {
					t.Errorf("transport %q, want %q", f.Transport(), tc.transport)
				}
				if !bytes.Equal(local, tc.addr) {
					t.Error("the bytes read differ from the granted ones")
				}
				if !leased {
					return
				}
				clear(local)
				f = p.Read([]Op{{Local: lr, Remote: rr, Len: n}})
				if err := f.Wait(ctx); err != nil {
					t.Fatal(err)
				}
				if f.Transport() != tc.transport || !bytes.Equal(local, tc.addr) {
					t.Errorf("through the lease: transport %q (want %q), bytes equal %v", f.Transport(), tc.transport, bytes.Equal(local, tc.addr))
				}
				quiet(t, c)
			})
		}
	}
}

// TestShmCopyFault: a fault while copying through a peer's mapping (a
// page its file no longer has: here a file truncated after it was
// mapped, which mapPeer's checks rule out for a peer's memory) fails the
// copy with an error instead of killing the process.
func TestShmCopyFault(t *testing.T) {
	fd, err := unix.MemfdCreate("fault", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, 2*4096); err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(fd, 0, 2*4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	unix.Ftruncate(fd, 4096) // the second page is gone: touching it faults
	var mu sync.Mutex
	active := true
	local := make([]byte, 2*4096)
	for _, write := range []bool{false, true} {
		if err := shmCopy(&mu, &active, local, m, write); err == nil || !strings.Contains(err.Error(), "fault") {
			t.Errorf("write %v: a copy over a page that is gone: %v, want a fault", write, err)
		}
	}
	if !mu.TryLock() {
		t.Fatal("the part's lock is still held after the fault")
	}
}

// TestSharedGrantManyMemories: a grant whose ranges name more memories
// than a link maps (here 80 ids for one file) maps at most maxMaps of
// them and copies the rest by process_vm: every byte arrives, and the
// endpoint's count of mappings stays within the bound.
func TestSharedGrantManyMemories(t *testing.T) {
	const k, piece = maxMaps + 16, 1024
	sh, err := NewShared(k * piece)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	fill(sh.Bytes(), 6)
	ctx, a, p, c, rr := sameHostInitiator(t, k*piece)
	local := make([]byte, k*piece)
	lr, _ := a.Register("l", local)
	ops := make([]Op, k)
	for i := range ops {
		ops[i] = Op{Local: lr, LocalOff: i * piece, Remote: rr, RemoteOff: i * piece, Len: piece}
	}
	f := p.Read(ops)
	h := sameHostRequest(t, c, nil)
	if h.kind != kReq || h.sub != rReadV {
		t.Fatalf("got %+v, want a same-host read", h)
	}
	iov := make([]byte, k*IovSize)
	for i := range k {
		v := iov[i*IovSize:]
		binary.LittleEndian.PutUint64(v, uint64(uintptr(unsafe.Pointer(&sh.Bytes()[i*piece]))))
		binary.LittleEndian.PutUint64(v[8:], piece)
		binary.LittleEndian.PutUint64(v[16:], uint64(1000+i)) // a memory id of its own each
		binary.LittleEndian.PutUint64(v[24:], uint64(i*piece))
		binary.LittleEndian.PutUint32(v[32:], uint32(sh.fd))
	}
	c.Write(append(hdr(header{kind: kResp, sub: rReadV, id: h.id, b: k, payload: uint32(len(iov))}), iov...))
	if err := f.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(local, sh.Bytes()) {
		t.Error("the bytes read differ from the granted ones")
	}
	if f.Transport() != "shm" {
		t.Errorf("transport %q, want shm", f.Transport())
	}
	if n := a.mapCount.Load(); n > maxMaps || n < 1 {
		t.Errorf("the endpoint maps %d memories, want 1 to %d", n, maxMaps)
	}
}

// TestIPCGrantChecked: an IPC grant is copied only within the allocation
// its handle opens, whose size is the driver's word: a range past it, or
// records that do not add up to the request, fail the link with nothing
// copied; a handle that does not open here sends the request again over
// TCP, and the link's later transfers of GPU memory go over TCP at once.
// A grant's allocation is closed by the time it is released (the peer
// may free it then). The handle is a child process's (a process cannot open its own); the
// fake target, this process, grants it.
func TestIPCGrantChecked(t *testing.T) {
	const n = 1 << 16
	g, handle, allocSize := gpuExporter(t, n, 7)
	want := make([]byte, n) // the child's bytes, at offset 4099 of its allocation
	fill(want, 7)
	h := func(recs ...ipcRec) []ipcRec { return recs }
	for _, tc := range []struct {
		name string
		recs []ipcRec
		// "ipc": read through the grant; "tcp": asked again over TCP;
		// "frame": the link fails, nothing copied.
		outcome string
	}{
		{"one range", h(ipcRec{handle, 4099, n}), "ipc"},
		{"two ranges", h(ipcRec{handle, 4099, 1000}, ipcRec{handle, 5099, n - 1000}), "ipc"},
		{"past the allocation", h(ipcRec{handle, allocSize - n + 1, n}), "frame"},
		{"far past the allocation", h(ipcRec{handle, 1 << 30, n}), "frame"},
		{"offset past the allocation", h(ipcRec{handle, 4099, n - 1}, ipcRec{handle, 1 << 30, 1}), "frame"},
		{"short of the request", h(ipcRec{handle, 4099, n - 1}), "frame"},
		{"a handle that does not open", h(ipcRec{[kernels.IPCHandleBytes]byte{1}, 0, n}), "tcp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "past the allocation" && !device.CUDAEmulated() {
				// CUDA may map an allocation rounded up to its
				// granularity: only the emulator's size is exact.
				t.Skip("the emulator's allocation size only")
			}
			p, c, rr, lr, ld, ctx := ipcFakeTarget(t, g, n)
			sentinel := bytes.Repeat([]byte{0xa5}, n)
			if err := ld.CopyFromHost(sentinel); err != nil {
				t.Fatal(err)
			}
			contents := func() []byte { return gpuContents(t, ld) }
			f := p.Read([]Op{{Local: lr, Remote: rr, Len: n}})
			rq := sameHostRequest(t, c, nil) // the lease refused: a grant per batch
			if rq.kind != kReq || rq.sub != rReadG {
				t.Fatalf("got %+v, want a same-host read of GPU memory", rq)
			}
			b := make([]byte, len(tc.recs)*IPCRecSize)
			for i := range tc.recs {
				tc.recs[i].put(b[i*IPCRecSize:])
			}
			c.Write(append(hdr(header{kind: kResp, sub: rReadG, id: rq.id, b: uint32(len(tc.recs)), payload: uint32(len(b))}), b...))
			switch tc.outcome {
			case "frame":
				if err := f.Wait(ctx); !errors.Is(err, ErrPeerLost) {
					t.Fatalf("a bad grant: %v, want ErrPeerLost", err)
				}
				if !bytes.Equal(contents(), sentinel) {
					t.Fatal("a bad grant copied bytes")
				}
				return
			case "tcp":
				// The grant is released, and the read asked again over
				// TCP, where the fake target answers with its bytes.
				if rel, _ := nextFrame(t, c); rel.kind != kRelease || rel.id != rq.id {
					t.Fatalf("got %+v, want the grant's release", rel)
				}
				again, _ := nextFrame(t, c)
				if again.kind != kReq || again.sub != rRead || again.id != rq.id {
					t.Fatalf("got %+v, want the read over TCP", again)
				}
				c.Write(append(hdr(header{kind: kResp, sub: rRead, id: rq.id, a: n}),
					append(hdr(header{kind: kData, id: rq.id, payload: n}), want...)...))
			}
			if err := f.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			if f.Transport() != tc.outcome {
				t.Errorf("transport %q, want %q", f.Transport(), tc.outcome)
			}
			if !bytes.Equal(contents(), want) {
				t.Fatal("the bytes read differ from the granted ones")
			}
			if tc.outcome == "ipc" {
				if rel, _ := nextFrame(t, c); rel.kind != kRelease || rel.id != rq.id {
					t.Fatalf("got %+v, want the grant's release", rel)
				}
				// Closed before the release: the peer may free it now.
				p.l.mu.Lock()
				open := len(p.l.ipcs)
				p.l.mu.Unlock()
				if open != 0 {
					t.Fatalf("%d of the peer's allocations still open after the release", open)
				}
				return
			}
			// After a handle that did not open, the next read goes over
			// TCP at once.
			readOverTCP(t, p, c, []Op{{Local: lr, Remote: rr, Len: n}})
		})
	}
}

// TestIPCLease: a batch of GPU memory on a same-host link asks a lease of
// the peer's GPU region; once the fake target grants it (a child
// process's IPC handle), reads copy through it asking nothing, whole and
// as ranges at offsets, every byte checked; a revocation is answered by
// the release, the allocation closed first, and later batches ask again
// per batch. A lease granted past its allocation, or answered as a lease
// of host memory, breaks the protocol; one whose handle does not open is
// given back unused, and the link's GPU memory goes over TCP after it.
func TestIPCLease(t *testing.T) {
	const n = 1 << 16
	g, handle, _ := gpuExporter(t, n, 9)
	want := make([]byte, n)
	fill(want, 9)
	setup := func(t *testing.T) (*Peer, net.Conn, RemoteRegion, *Region, *device.CUDABuffer, context.Context) {
		return ipcFakeTarget(t, g, n)
	}
	contents := gpuContents
	rec := func(r ipcRec) []byte {
		b := make([]byte, IPCRecSize)
		r.put(b)
		return b
	}
	// leaseAsked reads the lease request and the batch's own request,
	// which it answers with a grant of the child's bytes.
	leaseAsked := func(t *testing.T, c net.Conn) header {
		lq, _ := nextFrame(t, c)
		if lq.kind != kReq || lq.sub != rLeaseG || lq.a != n {
			t.Fatalf("got %+v, want a lease of the GPU region", lq)
		}
		rq, _ := nextFrame(t, c)
		if rq.kind != kReq || rq.sub != rReadG {
			t.Fatalf("got %+v, want the batch's request", rq)
		}
		c.Write(append(hdr(header{kind: kResp, sub: rReadG, id: rq.id, b: 1, payload: IPCRecSize}), rec(ipcRec{handle, 4099, n})...))
		if rel, _ := nextFrame(t, c); rel.kind != kRelease || rel.id != rq.id {
			t.Fatalf("got %+v, want the grant's release", rel)
		}
		return lq
	}

	t.Run("granted, used, revoked", func(t *testing.T) {
		p, c, rr, lr, ld, ctx := setup(t)
		f := p.Read([]Op{{Local: lr, Remote: rr, Len: n}})
		lq := leaseAsked(t, c)
		if err := f.Wait(ctx); err != nil || f.Transport() != "ipc" || !bytes.Equal(contents(t, ld), want) {
			t.Fatalf("the first read: %v, transport %q", err, f.Transport())
		}
		c.Write(append(hdr(header{kind: kResp, sub: rLeaseG, id: lq.id, b: 1, payload: IPCRecSize}), rec(ipcRec{handle, 4099, n})...))
		eventually(t, "the lease to be ready", func() bool {
			p.l.mu.Lock()
			defer p.l.mu.Unlock()
			ls := p.l.leaseIDs[lq.id]
			return ls != nil && ls.ready && ls.ipc != nil
		})
		// Through the lease: nothing asked, ranges at their offsets.
		if err := ld.CopyFromHost(make([]byte, n)); err != nil {
			t.Fatal(err)
		}
		ops := []Op{{Local: lr, LocalOff: 0, Remote: rr, RemoteOff: 100, Len: 5000}, {Local: lr, LocalOff: 6000, Remote: rr, RemoteOff: 40000, Len: n - 40000}}
		f = p.Read(ops)
		if err := f.Wait(ctx); err != nil || f.Transport() != "ipc" {
			t.Fatalf("a read through the lease: %v, transport %q", err, f.Transport())
		}
		got := contents(t, ld)
		for i, o := range ops {
			if !bytes.Equal(got[o.LocalOff:o.LocalOff+o.Len], want[o.RemoteOff:o.RemoteOff+o.Len]) {
				t.Fatalf("range %d read through the lease differs", i)
			}
		}
		quiet(t, c)
		// Revoked: released, the allocation closed before (the mapping
		// is gone by the time the release is read).
		p.l.mu.Lock()
		mapping := p.l.gpuLeases[rr.ID].ipc.ptr
		p.l.mu.Unlock()
		c.Write(hdr(header{kind: kRevoke, id: lq.id}))
		if rel, _ := nextFrame(t, c); rel.kind != kRelease || rel.id != lq.id {
			t.Fatalf("got %+v, want the lease's release", rel)
		}
		if _, _, err := g.Lib().MemRange(g.Ordinal, mapping); err == nil {
			t.Fatal("the lease's allocation is still mapped when its release arrives")
		}
		p.l.mu.Lock()
		open := len(p.l.ipcs)
		p.l.mu.Unlock()
		if open != 0 {
			t.Fatalf("%d allocations open after the lease's release", open)
		}
		p.Read([]Op{{Local: lr, Remote: rr, Len: n}})
		if rq, _ := nextFrame(t, c); rq.kind != kReq || rq.sub != rReadG {
			t.Fatalf("got %+v after the revocation, want a request per batch", rq)
		}
	})
	for _, tc := range []struct {
		name   string
		answer []byte
	}{
		{"past the allocation", append(hdr(header{kind: kResp, sub: rLeaseG, b: 1, payload: IPCRecSize}), rec(ipcRec{handle, 1 << 30, n})...)},
		{"a region of another size", append(hdr(header{kind: kResp, sub: rLeaseG, b: 1, payload: IPCRecSize}), rec(ipcRec{handle, 4099, n - 1})...)},
		{"answered as host memory", append(hdr(header{kind: kResp, sub: rLease, b: 1, payload: IovSize}), make([]byte, IovSize)...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, c, rr, lr, _, ctx := setup(t)
			f := p.Read([]Op{{Local: lr, Remote: rr, Len: n}})
			lq, _ := nextFrame(t, c)
			if lq.kind != kReq || lq.sub != rLeaseG {
				t.Fatalf("got %+v, want a lease of the GPU region", lq)
			}
			binary.LittleEndian.PutUint64(tc.answer[8:], lq.id)
			c.Write(tc.answer)
			if err := f.Wait(ctx); !errors.Is(err, ErrPeerLost) {
				t.Fatalf("a bad lease: %v, want the link to fail (ErrPeerLost)", err)
			}
		})
	}
	t.Run("a handle that does not open", func(t *testing.T) {
		p, c, rr, lr, ld, ctx := setup(t)
		f := p.Read([]Op{{Local: lr, Remote: rr, Len: n}})
		lq := leaseAsked(t, c)
		if err := f.Wait(ctx); err != nil || !bytes.Equal(contents(t, ld), want) {
			t.Fatalf("the first read: %v", err)
		}
		c.Write(append(hdr(header{kind: kResp, sub: rLeaseG, id: lq.id, b: 1, payload: IPCRecSize}), rec(ipcRec{[kernels.IPCHandleBytes]byte{1}, 0, n})...))
		if rel, _ := nextFrame(t, c); rel.kind != kRelease || rel.id != lq.id {
			t.Fatalf("got %+v, want the lease given back", rel)
		}
		readOverTCP(t, p, c, []Op{{Local: lr, Remote: rr, Len: n}})
	})
}

// TestLeaseGivenBackWhileOpening: a GPU lease whose grant is being opened
// when the endpoint starts closing (giveBackLeases, Close's first step)
// is still released once opened, its allocation closed first; it is not
// left open and held by the target until the link's end.
func TestLeaseGivenBackWhileOpening(t *testing.T) {
	const n = 1 << 16
	g, handle, _ := gpuExporter(t, n, 9)
	p, c, rr, lr, _, _ := ipcFakeTarget(t, g, n)
	p.Read([]Op{{Local: lr, Remote: rr, Len: n}})
	lq, _ := nextFrame(t, c)
	if lq.kind != kReq || lq.sub != rLeaseG {
		t.Fatalf("got %+v, want a lease of the GPU region", lq)
	}
	nextFrame(t, c) // the batch's own request, left unanswered
	entered, proceed := make(chan struct{}), make(chan struct{})
	testHookLeaseOpen = func() { close(entered); <-proceed }
	defer func() { testHookLeaseOpen = nil }()
	rec := make([]byte, IPCRecSize)
	(&ipcRec{handle, 4099, n}).put(rec)
	c.Write(append(hdr(header{kind: kResp, sub: rLeaseG, id: lq.id, b: 1, payload: IPCRecSize}), rec...))
	<-entered
	p.l.giveBackLeases()
	close(proceed)
	for {
		h, _ := nextFrame(t, c)
		if h.kind == kRelease && h.id == lq.id {
			break
		}
	}
	p.l.mu.Lock()
	open := len(p.l.ipcs)
	p.l.mu.Unlock()
	if open != 0 {
		t.Fatalf("%d allocations open after the lease's release", open)
	}
}

// gpuExporter starts a gpu-export child whose n bytes from seed lie at
// offset 4099 of its allocation (gpuMem), and returns this process's GPU
// 0, the allocation's IPC handle and its size; it skips the test without
// a CUDA backend.
func gpuExporter(t *testing.T, n int, seed uint64) (*device.GPU, [kernels.IPCHandleBytes]byte, uint64) {
	t.Helper()
	var handle [kernels.IPCHandleBytes]byte
	g := gpuOrSkip(t)
	_, line := startChildLine(t, "gpu-export", "", n, seed)
	var hx string
	var allocSize uint64
	if _, err := fmt.Sscan(line, &hx, &allocSize); err != nil {
		t.Fatalf("the child printed %q: %v", line, err)
	}
	raw, err := hex.DecodeString(hx)
	if err != nil || len(raw) != len(handle) {
		t.Fatalf("handle %q: %v", hx, err)
	}
	copy(handle[:], raw)
	return g, handle, allocSize
}

// ipcFakeTarget links a fresh endpoint to a fake same-host target with
// one region of n bytes, lets the link use CUDA IPC (the fake target is
// this process, but the handles it grants are a child's), and registers
// n bytes of GPU memory on g as the local region.
func ipcFakeTarget(t *testing.T, g *device.GPU, n int) (*Peer, net.Conn, RemoteRegion, *Region, *device.CUDABuffer, context.Context) {
	t.Helper()
	ld, err := g.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ld.Free() }) // after the endpoint's Close (cleanups run last first)
	ctx, a, p, c, rr := sameHostInitiator(t, uint64(n))
	p.l.ipcOff.Store(false)
	lr, err := a.Register("l", ld)
	if err != nil {
		t.Fatal(err)
	}
	return p, c, rr, lr, ld, ctx
}

// readOverTCP starts a read of ops and checks that the fake target c
// gets it as a read over TCP (IPC is off on the link).
func readOverTCP(t *testing.T, p *Peer, c net.Conn, ops []Op) {
	t.Helper()
	p.Read(ops)
	if rq, _ := nextFrame(t, c); rq.kind != kReq || rq.sub != rRead {
		t.Fatalf("got %+v, want a read over TCP", rq)
	}
}

// gpuContents is d's bytes.
func gpuContents(t *testing.T, d *device.CUDABuffer) []byte {
	t.Helper()
	b := make([]byte, d.Len)
	if err := d.CopyToHost(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestIPCCloseThenOpen: a grant that opens an allocation while the grant
// before it, done with the same allocation, has yet to close it takes
// the open that is still there and goes through CUDA IPC; it does not
// open the allocation a second time (CUDA counts the opens: a second one
// the link does not record would never be closed), fall back to TCP or
// turn IPC off for the link. Nor is the allocation closed twice: on the
// emulator, its mapping is gone after both releases.
func TestIPCCloseThenOpen(t *testing.T) {
	const n = 1 << 16
	g, handle, _ := gpuExporter(t, n, 9)
	p, c, rr, lr, ld, ctx := ipcFakeTarget(t, g, n)
	rec := make([]byte, IPCRecSize)
	(&ipcRec{handle, 4099, n}).put(rec)
	grant := func(id uint64) {
		c.Write(append(hdr(header{kind: kResp, sub: rReadG, id: id, b: 1, payload: IPCRecSize}), rec...))
	}
	f1 := p.Read([]Op{{Local: lr, Remote: rr, Len: n}})
	rq1 := sameHostRequest(t, c, nil) // the lease refused: a grant per batch
	f2 := p.Read([]Op{{Local: lr, Remote: rr, Len: n}})
	rq2, _ := nextFrame(t, c)
	if rq1.sub != rReadG || rq2.sub != rReadG {
		t.Fatalf("got %+v and %+v, want two same-host reads of GPU memory", rq1, rq2)
	}
	// The first grant's close waits until the second grant is answered.
	closing, proceed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	testHookIPCClose = func() {
		first := false
		once.Do(func() { first = true })
		if first {
			close(closing)
			<-proceed
		}
	}
	defer func() { testHookIPCClose = nil }()
	grant(rq1.id)
	<-closing
	p.l.mu.Lock()
	var mapped kernels.Ptr
	for _, m := range p.l.ipcs {
		mapped = m.ptr
	}
	p.l.mu.Unlock()
	grant(rq2.id)
	if rel, _ := nextFrame(t, c); rel.kind != kRelease || rel.id != rq2.id {
		t.Fatalf("got %+v, want the second grant's release", rel)
	}
	close(proceed)
	if rel, _ := nextFrame(t, c); rel.kind != kRelease || rel.id != rq1.id {
		t.Fatalf("got %+v, want the first grant's release", rel)
	}
	for i, f := range []*Future{f1, f2} {
		if err := f.Wait(ctx); err != nil || f.Transport() != "ipc" {
			t.Fatalf("read %d: %v, transport %q", i+1, err, f.Transport())
		}
	}
	want := make([]byte, n)
	fill(want, 9)
	if !bytes.Equal(gpuContents(t, ld), want) {
		t.Fatal("the bytes read differ")
	}
	p.l.mu.Lock()
	open := len(p.l.ipcs)
	p.l.mu.Unlock()
	if open != 0 || p.l.ipcOff.Load() {
		t.Fatalf("%d allocations open after both releases, IPC off %v", open, p.l.ipcOff.Load())
	}
	if mapped == 0 {
		t.Fatal("no allocation open while the first grant closed")
	}
	if _, _, err := g.Lib().MemRange(g.Ordinal, mapped); device.CUDAEmulated() && err == nil {
		t.Fatalf("the allocation is still mapped at %#x after both releases (opened more often than closed)", uint64(mapped))
	}
}

// TestImmPerPeer: a peer that fills the target's queue of undelivered
// immediates gets "busy" refusals once it holds maxImmPeer of them, while
// another peer's WriteWithImm still goes through; once the target takes
// one of the first peer's, that peer may write again, and Imm hands every
// accepted immediate over once.
func TestImmPerPeer(t *testing.T) {
	_, st := storeFor(t)
	ctx := ctxT(t, 2*time.Minute)
	target, flood, other := published(t, ctx, st, "target", nil), published(t, ctx, st, "flood", nil), published(t, ctx, st, "other", nil)
	// Writes in flight at once land on bytes of their own: the flooding
	// peer's on 0..255, the other's on 256.
	const inFlight = 256
	tr, _ := target.Register("kv", make([]byte, inFlight+1))
	peerOf := func(e *Endpoint) (*Peer, *Region) {
		p, err := e.Connect(ctx, "target")
		if err != nil {
			t.Fatal(err)
		}
		lr, _ := e.Register("src", []byte{1})
		return p, lr
	}
	at := func(lr *Region, off int) []Op { return []Op{{Local: lr, Remote: tr.Remote(), RemoteOff: off, Len: 1}} }
	fp, flr := peerOf(flood)
	op, olr := peerOf(other)
	fops, oops := at(flr, 0), at(olr, inFlight)
	// The flooding peer fills its share, inFlight writes at a time.
	for sent := 0; sent < maxImmPeer; {
		var fs []*Future
		for ; sent < maxImmPeer && len(fs) < inFlight; sent++ {
			fs = append(fs, fp.WriteWithImm(at(flr, len(fs)), uint32(sent)))
		}
		for _, f := range fs {
			if err := f.Wait(ctx); err != nil {
				t.Fatalf("immediate %d of %d: %v", sent, maxImmPeer, err)
			}
		}
	}
	err := fp.WriteWithImm(fops, maxImmPeer).Wait(ctx)
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "undelivered immediates") {
		t.Fatalf("a peer past its share of undelivered immediates: %v, want a busy refusal", err)
	}
	if err := op.WriteWithImm(oops, 7).Wait(ctx); err != nil {
		t.Fatalf("another peer's immediate while the first holds its share: %v", err)
	}
	// Concurrent writes land in any order: count each immediate once.
	seen := make(map[uint32]bool)
	take := func() Imm {
		im, err := target.Imm(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if im.Peer == "flood" {
			if seen[im.Value] || im.Value == maxImmPeer || im.Value > maxImmPeer+1 {
				t.Fatalf("immediate %+v: repeated, refused or never sent", im)
			}
			seen[im.Value] = true
		} else if im.Peer != "other" || im.Value != 7 {
			t.Fatalf("immediate %+v, want flood's or other's 7", im)
		}
		return im
	}
	if im := take(); im.Peer != "flood" {
		t.Fatalf("first immediate %+v, want one of the flooding peer's (queued first)", im)
	}
	if err := fp.WriteWithImm(fops, maxImmPeer+1).Wait(ctx); err != nil {
		t.Fatalf("after the target took one: %v", err)
	}
	for range maxImmPeer + 1 {
		take()
	}
	if len(seen) != maxImmPeer+1 {
		t.Fatalf("the target took %d of the flooding peer's %d immediates", len(seen), maxImmPeer+1)
	}
}

// TestImmTotal: the endpoint holds at most maxImm undelivered immediates
// of all its peers together. Once peers within their own shares have
// filled it, a further peer's WriteWithImm is refused as busy; once the
// target takes one, it goes through, and Imm hands every accepted one
// over once.
func TestImmTotal(t *testing.T) {
	_, st := storeFor(t)
	ctx := ctxT(t, 2*time.Minute)
	const fillers = maxImm / maxImmPeer
	const inFlight = 256
	target := published(t, ctx, st, "target", nil)
	tr, _ := target.Register("kv", make([]byte, inFlight))
	type sender struct {
		p  *Peer
		lr *Region
	}
	senders := make([]sender, fillers+1)
	for i := range senders {
		e := published(t, ctx, st, fmt.Sprintf("s%d", i), nil)
		p, err := e.Connect(ctx, "target")
		if err != nil {
			t.Fatal(err)
		}
		lr, _ := e.Register("src", []byte{1})
		senders[i] = sender{p, lr}
	}
	at := func(s sender, off int) []Op { return []Op{{Local: s.lr, Remote: tr.Remote(), RemoteOff: off, Len: 1}} }
	// Each filler sends its whole share, inFlight writes at a time.
	for _, s := range senders[:fillers] {
		for sent := 0; sent < maxImmPeer; {
			var fs []*Future
			for ; sent < maxImmPeer && len(fs) < inFlight; sent++ {
				fs = append(fs, s.p.WriteWithImm(at(s, len(fs)), uint32(sent)))
			}
			for _, f := range fs {
				if err := f.Wait(ctx); err != nil {
					t.Fatalf("%s: immediate %d of %d: %v", s.p.Name(), sent, maxImmPeer, err)
				}
			}
		}
	}
	last := senders[fillers]
	err := last.p.WriteWithImm(at(last, 0), 0).Wait(ctx)
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "undelivered immediates") {
		t.Fatalf("an immediate past the endpoint's %d undelivered ones: %v, want a busy refusal", maxImm, err)
	}
	seen := make(map[Imm]bool)
	take := func() {
		im, err := target.Imm(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if seen[im] {
			t.Fatalf("immediate %+v taken twice", im)
		}
		seen[im] = true
	}
	take()
	if err := last.p.WriteWithImm(at(last, 0), 1).Wait(ctx); err != nil {
		t.Fatalf("after the target took one: %v", err)
	}
	for range maxImm {
		take()
	}
	for i := range fillers {
		for v := range uint32(maxImmPeer) {
			if im := (Imm{Peer: fmt.Sprintf("s%d", i), Value: v}); !seen[im] {
				t.Fatalf("immediate %+v never taken", im)
			}
		}
	}
	if im := (Imm{Peer: fmt.Sprintf("s%d", fillers), Value: 1}); !seen[im] || seen[Imm{Peer: im.Peer, Value: 0}] {
		t.Fatalf("the last peer's accepted immediate not taken, or its refused one taken")
	}
}

// TestSharedFileShrunk: a file in /dev/shm cannot be sealed, so its
// owner may shrink it while a peer copies through a lease of it: the
// copy then fails with the fault (the process goes on), and a copy of
// the pages still there succeeds.
func TestSharedFileShrunk(t *testing.T) {
	const n = 1 << 16
	f, err := os.CreateTemp("/dev/shm", "slimego-p2ptest-")
	if err != nil {
		t.Skip("no /dev/shm:", err)
	}
	os.Remove(f.Name())
	defer f.Close()
	f.Truncate(n)
	sh, err := MapShared(int(f.Fd()), 0, n)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	fill(sh.Bytes(), 8)
	ctx, a, p, c, rr := sameHostInitiator(t, n)
	local := make([]byte, n)
	lr, _ := a.Register("l", local)
	iov := grantIovec(sh.Bytes(), sh.id, 0, uint32(sh.fd))
	fr := p.Read([]Op{{Local: lr, Remote: rr, Len: n}})
	h := sameHostRequest(t, c, iov)
	c.Write(append(hdr(header{kind: kResp, sub: rReadV, id: h.id, b: 1, payload: IovSize}), iov...))
	if err := fr.Wait(ctx); err != nil || fr.Transport() != "shm" || !bytes.Equal(local, sh.Bytes()) {
		t.Fatalf("the first read: %v, transport %q", err, fr.Transport())
	}
	// Through the lease from here on; the file loses its second half.
	if err := f.Truncate(n / 2); err != nil {
		t.Fatal(err)
	}
	fr = p.Read([]Op{{Local: lr, Remote: rr, Len: n}})
	if err := fr.Wait(ctx); err == nil || !strings.Contains(err.Error(), "fault") {
		t.Fatalf("a read over pages that are gone: %v, want the fault", err)
	}
	clear(local)
	fr = p.Read([]Op{{Local: lr, Remote: rr, Len: n / 2}})
	if err := fr.Wait(ctx); err != nil || fr.Transport() != "shm" || !bytes.Equal(local[:n/2], sh.Bytes()[:n/2]) {
		t.Fatalf("a read of the half still there: %v, transport %q", err, fr.Transport())
	}
	quiet(t, c)
}

// TestMapShared: MapShared takes a range of a regular file on tmpfs
// only; its memory is the same pages as the caller's mapping of the
// file, from any offset, and stays valid once the caller's descriptor is
// closed, until Close.
func TestMapShared(t *testing.T) {
	const page = 4096
	f, err := os.CreateTemp("/dev/shm", "slimego-p2ptest-")
	if err != nil {
		t.Skip("no /dev/shm:", err)
	}
	os.Remove(f.Name())
	f.Truncate(3 * page)
	fd := int(f.Fd())
	disk, err := os.CreateTemp(t.TempDir(), "disk")
	if err != nil {
		t.Fatal(err)
	}
	defer disk.Close()
	disk.Truncate(3 * page)
	dir, err := os.Open("/dev/shm")
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	for _, tc := range []struct {
		name string
		fd   int
		off  int64
		n    int
	}{
		{"no descriptor", -1, 0, page},
		{"a descriptor not open", 1 << 20, 0, page},
		{"a negative offset", fd, -1, page},
		{"no bytes", fd, 0, 0},
		{"past the end", fd, 2*page + 1, page},
		{"a file on disk", int(disk.Fd()), 0, page},
		{"a directory on tmpfs", int(dir.Fd()), 0, 1},
	} {
		if sh, err := MapShared(tc.fd, tc.off, tc.n); !errors.Is(err, ErrInvalid) {
			if sh != nil {
				sh.Close()
			}
			t.Errorf("%s: %v, want ErrInvalid", tc.name, err)
		}
	}
	mine, err := unix.Mmap(fd, 0, 3*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mine)
	sh, err := MapShared(fd, page+100, page)
	if err != nil {
		t.Fatal(err)
	}
	f.Close() // MapShared holds a descriptor of its own
	fill(mine, 9)
	if b := sh.Bytes(); len(b) != page || !bytes.Equal(b, mine[page+100:2*page+100]) {
		t.Fatalf("MapShared's bytes (%d) are not the file's at the offset", len(b))
	}
	fill(sh.Bytes(), 10)
	if !bytes.Equal(sh.Bytes(), mine[page+100:2*page+100]) {
		t.Fatal("what MapShared's memory holds is not in the caller's mapping")
	}
	if err := sh.Close(); err != nil || sh.Bytes() != nil {
		t.Fatalf("Close: %v, bytes %d", err, len(sh.Bytes()))
	}
}

// TestSharedFileUnmapped: a peer's file in /dev/shm is unmapped as soon
// as no grant or lease uses it (its space in /dev/shm stays taken while
// it is mapped, even once its owners have freed it), where a memory file
// stays mapped for later grants. The range starts at an offset that is
// not a page's.
func TestSharedFileUnmapped(t *testing.T) {
	const n, base = 1 << 16, 4096 + 100
	file, err := os.CreateTemp("/dev/shm", "slimego-p2ptest-")
	if err != nil {
		t.Skip("no /dev/shm:", err)
	}
	os.Remove(file.Name())
	defer file.Close()
	file.Truncate(base + n)
	sh, err := MapShared(int(file.Fd()), base, n)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	fill(sh.Bytes(), 12)
	iov := grantIovec(sh.Bytes(), sh.id, base, uint32(sh.fd))
	for _, leased := range []bool{false, true} {
		t.Run(fmt.Sprintf("leased=%v", leased), func(t *testing.T) {
			ctx, a, p, c, rr := sameHostInitiator(t, n)
			local := make([]byte, n)
			lr, _ := a.Register("l", local)
			maps := func() int {
				p.l.mu.Lock()
				defer p.l.mu.Unlock()
				return len(p.l.maps)
			}
			// released reads frames until the release of id.
			released := func(id uint64) {
				t.Helper()
				for {
					h, _ := nextFrame(t, c)
					if h.kind == kRelease && h.id == id {
						return
					}
					if h.kind != kRelease {
						t.Fatalf("got %+v, want the release of %d", h, id)
					}
				}
			}
			fr := p.Read([]Op{{Local: lr, Remote: rr, Len: n}})
			var lq header
			for {
				h, _ := nextFrame(t, c)
				if h.kind == kReq && h.sub == rLease {
					lq = h
					if leased {
						c.Write(append(hdr(header{kind: kResp, sub: rLease, id: h.id, b: 1, payload: IovSize}), iov...))
					} else {
						c.Write(hdr(header{kind: kResp, sub: rLease, id: h.id, status: stNotHost}))
					}
					continue
				}
				if h.kind != kReq || h.sub != rReadV {
					t.Fatalf("got %+v, want a same-host read", h)
				}
				c.Write(append(hdr(header{kind: kResp, sub: rReadV, id: h.id, b: 1, payload: IovSize}), iov...))
				if err := fr.Wait(ctx); err != nil || fr.Transport() != "shm" || !bytes.Equal(local, sh.Bytes()) {
					t.Fatalf("the read: %v, transport %q", err, fr.Transport())
				}
				if !leased {
					released(h.id)
					if m := maps(); m != 0 {
						t.Fatalf("%d mappings of the file after the grant's release", m)
					}
					return
				}
				break
			}
			eventually(t, "the lease to be ready", func() bool {
				p.l.mu.Lock()
				defer p.l.mu.Unlock()
				ls := p.l.leaseIDs[lq.id]
				return ls != nil && ls.ready && ls.g.m != nil
			})
			clear(local)
			if err := p.Read([]Op{{Local: lr, Remote: rr, Len: n}}).Wait(ctx); err != nil || !bytes.Equal(local, sh.Bytes()) {
				t.Fatalf("a read through the lease: %v", err)
			}
			if m := maps(); m != 1 {
				t.Fatalf("%d mappings of the file while the lease holds it, want 1", m)
			}
			c.Write(hdr(header{kind: kRevoke, id: lq.id}))
			released(lq.id)
			if m := maps(); m != 0 {
				t.Fatalf("%d mappings of the file after the lease's release", m)
			}
		})
	}
}

// TestWriteImmRides: a WriteWithImm of one stripe over TCP is one
// request (rWriteImm: the write's descriptors, then the immediate) and
// one answer, not a write and then an immediate. As initiator: the
// request carries the immediate after the descriptors, and an answer
// "busy" (the bytes in place, the immediate refused) fails the Future
// with the refusal. As target: the immediate is queued once the bytes
// are in place, not when the write is refused, and one of more than 32
// bits breaks the protocol.
func TestWriteImmRides(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	t.Run("initiator", func(t *testing.T) {
		e := endpoint(t, ctx, Options{Name: "a", Auth: testAuth(), Channels: 1, TCPOnly: true})
		p, c, rr := fakeTarget(t, e)
		src := []byte("12345678")
		lr, _ := e.Register("l", src)
		for _, st := range []uint8{stOK, stBusy} {
			f := p.WriteWithImm([]Op{{Local: lr, Remote: rr, RemoteOff: 40, Len: 8}}, 0xfeedbeef)
			h, pl := nextFrame(t, c)
			if h.kind != kReq || h.sub != rWriteImm || h.a != 8 || h.b != 1 || len(pl) != stripeSize+DescSize+immSize {
				t.Fatalf("got %+v (%d bytes), want one write request with its immediate", h, len(pl))
			}
			if imm := binary.LittleEndian.Uint64(pl[stripeSize+DescSize:]); imm != 0xfeedbeef {
				t.Fatalf("the request's immediate is %#x", imm)
			}
			if d, dp := nextFrame(t, c); d.kind != kData || d.id != h.id || string(dp) != string(src) {
				t.Fatalf("got %+v %q, want the write's bytes", d, dp)
			}
			c.Write(hdr(header{kind: kResp, sub: rWrite, id: h.id, status: st}))
			err := f.Wait(ctx)
			if st == stOK && err != nil {
				t.Fatal(err)
			}
			if st == stBusy && (!errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "undelivered immediates")) {
				t.Fatalf("answered busy: %v, want the refusal", err)
			}
		}
		quiet(t, c) // no immediate of its own follows
	})
	// rawTarget is an endpoint with a region of 64 zero bytes (r, rr) and a raw
	// member's connection to it, past its hello.
	rawTarget := func(t *testing.T) (*Endpoint, *Region, RemoteRegion, []byte, net.Conn) {
		b := endpoint(t, ctx, Options{Name: "b", Auth: testAuth()})
		mem := make([]byte, 64)
		r, _ := b.Register("m", mem)
		c := member(t, b, helloFrame(7, 0, 1, 20000, 1, "raw"), 0)
		return b, r, r.Remote(), mem, c
	}
	// request is an rWriteImm of n bytes at off of rr with key, and
	// first, the bytes of its first data frame.
	request := func(id uint64, rr RemoteRegion, key, off, n, imm uint64, first string) []byte {
		pl := make([]byte, stripeSize+DescSize+immSize)
		(&desc{rr.ID, key, off, n}).put(pl[stripeSize:])
		binary.LittleEndian.PutUint64(pl[stripeSize+DescSize:], imm)
		m := append(hdr(header{kind: kReq, sub: rWriteImm, id: id, a: n, b: 1, payload: uint32(len(pl))}), pl...)
		return append(append(m, hdr(header{kind: kData, id: id, payload: uint32(len(first))})...), first...)
	}
	// underWay waits until a request is served on r.
	underWay := func(t *testing.T, r *Region) {
		t.Helper()
		eventually(t, "the write to be under way", func() bool {
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.refs > 0
		})
	}
	noImm := func(t *testing.T, b *Endpoint) {
		t.Helper()
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		if im, err := b.Imm(short); err == nil {
			t.Fatalf("an immediate %+v the target should not have", im)
		}
	}
	answer := func(t *testing.T, c net.Conn, id uint64, st uint8) {
		t.Helper()
		if h, _ := nextFrame(t, c); h.kind != kResp || h.sub != rWrite || h.id != id || h.status != st {
			t.Fatalf("got %+v, want the answer to write %d with status %d", h, id, st)
		}
	}
	t.Run("target", func(t *testing.T) {
		b, _, rr, mem, c := rawTarget(t)
		c.Write(request(1, rr, rr.Key+1, 8, 8, 5, "abcdefgh"))
		answer(t, c, 1, stKey)
		noImm(t, b)
		if string(mem[8:16]) != "\x00\x00\x00\x00\x00\x00\x00\x00" {
			t.Fatal("a refused write changed the region")
		}
		c.Write(request(2, rr, rr.Key, 8, 8, 6, "abcdefgh"))
		answer(t, c, 2, stOK)
		if im, err := b.Imm(ctx); err != nil || im.Value != 6 || im.Peer != "raw" || string(mem[8:16]) != "abcdefgh" {
			t.Fatalf("immediate %+v (%v), bytes %q", im, err, mem[8:16])
		}
		c.Write(request(3, rr, rr.Key, 8, 8, 1<<32, "abcdefgh"))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		for {
			var b [HeaderSize]byte
			if _, err := readFull(c, b[:]); err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) {
					t.Fatal("an immediate of 33 bits: the link goes on")
				}
				break // closed
			}
			if h, err := decodeHeader(b[:]); err != nil || h.kind != kPing {
				t.Fatalf("an immediate of 33 bits answered %+v (%v)", h, err)
			}
		}
		noImm(t, b)
	})
	// A write cut short by its initiator (an end frame) is not answered
	// and queues no immediate; the stream stays in step.
	t.Run("target/cut-short", func(t *testing.T) {
		b, _, rr, _, c := rawTarget(t)
		c.Write(append(request(1, rr, rr.Key, 0, 16, 5, "abcdefgh"), hdr(header{kind: kEnd, id: 1, status: stCancelled})...))
		c.Write(request(2, rr, rr.Key, 16, 8, 6, "ABCDEFGH"))
		answer(t, c, 2, stOK)
		if im, err := b.Imm(ctx); err != nil || im.Value != 6 {
			t.Fatalf("the next write's immediate: %+v, %v (the cut one's must not come first)", im, err)
		}
		noImm(t, b)
	})
	// A region deregistered in the middle of the write: refused, no
	// immediate.
	t.Run("target/deregistered", func(t *testing.T) {
		b, r, rr, _, c := rawTarget(t)
		c.Write(request(1, rr, rr.Key, 0, 16, 5, "abcdefgh"))
		underWay(t, r)
		done := make(chan error, 1)
		go func() { done <- b.Deregister(ctx, r) }()
		eventually(t, "the region to be withdrawn", r.closed.Load)
		// Its next chunk finds the region gone.
		c.Write(append(hdr(header{kind: kData, id: 1, payload: 8}), "ijklmnop"...))
		answer(t, c, 1, stNoRegion)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		noImm(t, b)
	})
	// The connection closed in the middle of the write: no immediate.
	t.Run("target/link-lost", func(t *testing.T) {
		b, r, rr, _, c := rawTarget(t)
		c.Write(request(1, rr, rr.Key, 0, 16, 5, "abcdefgh"))
		underWay(t, r)
		c.Close()
		noImm(t, b)
	})
	// The peer's share of undelivered immediates full: the bytes land,
	// the answer is busy, the immediate is not queued.
	t.Run("target/busy", func(t *testing.T) {
		b, r, rr, mem, c := rawTarget(t)
		eventually(t, "the raw peer's link", func() bool { return b.Peer("raw") != nil })
		raw := b.Peer("raw")
		for i := range maxImmPeer {
			if !b.pushImm(raw.l.imm, uint32(i)) {
				t.Fatal("the queue is full early")
			}
		}
		c.Write(request(1, rr, rr.Key, 0, 8, maxImmPeer, "abcdefgh"))
		answer(t, c, 1, stBusy)
		if err := b.Deregister(ctx, r); err != nil { // after the write's last touch
			t.Fatal(err)
		}
		if string(mem[:8]) != "abcdefgh" {
			t.Fatalf("the bytes of a write answered busy: %q", mem[:8])
		}
		for i := range maxImmPeer {
			if im, err := b.Imm(ctx); err != nil || im.Value != uint32(i) {
				t.Fatalf("immediate %d: %+v, %v", i, im, err)
			}
		}
		noImm(t, b)
	})
}

// TestOneConnectionClosed: a peer that closes one of a link's
// connections and keeps the other open (and silent) fails the link
// within closeGrace, not at the heartbeat: the transfers fail with
// ErrPeerLost.
func TestOneConnectionClosed(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	e := endpoint(t, ctx, Options{Name: "a", Auth: testAuth(), Channels: 2, TCPOnly: true, Heartbeat: 20 * time.Second})
	addr, got := fakeAcceptorN(t, "evil", 2)
	rr := RemoteRegion{Name: "m", ID: 1, Key: 2, Size: 1 << 20}
	p, c0 := fakeLink(t, ctx, e, info{name: "evil", addr: addr, regions: []RemoteRegion{rr}}, got)
	c1, ok := <-got
	if !ok {
		t.Fatal("the fake target got one connection")
	}
	defer c1.Close()
	lr, _ := e.Register("l", make([]byte, 64))
	f := p.Read([]Op{{Local: lr, Remote: rr, Len: 64}})
	c0.Close()
	// The grace is 100 ms; the link also fails when a write on the
	// closed connection does (a ping: seconds later), which must not be
	// what ends it here.
	short, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	if err := f.Wait(short); !errors.Is(err, ErrPeerLost) {
		t.Fatalf("a read after the peer closed one of two connections: %v, want ErrPeerLost within the grace", err)
	}
}

// answerRead answers the read request h with its bytes, filled from seed.
func answerRead(c net.Conn, h header, seed uint64) {
	b := make([]byte, h.a)
	fill(b, seed)
	c.Write(append(hdr(header{kind: kResp, sub: rRead, id: h.id, a: h.a}),
		append(hdr(header{kind: kData, id: h.id, payload: uint32(len(b))}), b...)...))
}

// TestWaitParked: a Wait parks on its connection's waker (the first in
// the table for each connection; a second one at once waits on its
// Future's channel) and ends when the answer comes, the context is
// cancelled, its deadline or Options.Timeout passes, or the link ends;
// never later.
func TestWaitParked(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout time.Duration // Options.Timeout
		// wait returns the context the Wait is given.
		wait func() (context.Context, context.CancelFunc)
		// target acts as the fake target on the read request h.
		target func(c net.Conn, h header)
		want   error // nil: the read succeeds
	}{
		{"answered", time.Minute, func() (context.Context, context.CancelFunc) { return context.Background(), func() {} },
			func(c net.Conn, h header) { time.Sleep(30 * time.Millisecond); answerRead(c, h, 9) }, nil},
		{"answered-cancellable", time.Minute, func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) },
			func(c net.Conn, h header) { time.Sleep(30 * time.Millisecond); answerRead(c, h, 9) }, nil},
		{"cancelled", time.Minute, func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(50*time.Millisecond, cancel)
			return ctx, cancel
		}, nil, ErrCancelled},
		{"deadline", time.Minute, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 100*time.Millisecond)
		}, nil, ErrTimeout},
		{"options-timeout", 100 * time.Millisecond, func() (context.Context, context.CancelFunc) { return context.Background(), func() {} },
			nil, ErrTimeout},
		{"link-ends", time.Minute, func() (context.Context, context.CancelFunc) { return context.Background(), func() {} },
			func(c net.Conn, h header) { time.Sleep(30 * time.Millisecond); c.Close() }, ErrPeerLost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A heartbeat far from every case's end, so that only the
			// Wait's own wake, cancel or deadline can end it in time.
			a, err := New(ctxT(t, 10*time.Second), Options{Name: "a", Auth: testAuth(), Channels: 1, Timeout: tc.timeout, Heartbeat: 20 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			p, c, rr := fakeTarget(t, a)
			w := p.l.conns[0].waker
			if w == nil {
				t.Fatal("the connection has no waker")
			}
			dst := make([]byte, 8)
			lr, _ := a.Register("dst", dst)
			f := p.Read([]Op{{Local: lr, Remote: rr, Len: len(dst)}})
			h, _ := nextFrame(t, c)
			if tc.target != nil {
				go tc.target(c, h)
			}
			ctx, cancel := tc.wait()
			defer cancel()
			start, parks := time.Now(), w.parks.Load()
			err = f.Wait(ctx)
			took := time.Since(start)
			if w.parks.Load() != parks+1 {
				t.Errorf("the Wait parked %d times on the waker, want once", w.parks.Load()-parks)
			}
			if took > 2*time.Second {
				t.Errorf("the Wait took %v", took)
			}
			if tc.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				want := make([]byte, 8)
				fill(want, 9)
				if !bytes.Equal(dst, want) {
					t.Fatalf("read %x, want %x", dst, want)
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("%v, want %v", err, tc.want)
			}
			select {
			case <-f.Done():
			default:
				t.Fatal("Wait returned before the Future was done")
			}
		})
	}
}

// TestWaitWakerClosed: a link failed from a goroutine other than its
// own (Close, a grace timer, a process watch) may close the waker a Wait
// holds before fail has finished that Wait's part (here one of 20000
// unanswered reads); the Wait then waits on its Future's channel and
// returns the link's error, the Future done.
func TestWaitWakerClosed(t *testing.T) {
	for round := range 5 {
		a, err := New(ctxT(t, 10*time.Second), Options{Name: "a", Auth: testAuth(), Channels: 1})
		if err != nil {
			t.Fatal(err)
		}
		p, _, rr := fakeTarget(t, a)
		dst := make([]byte, 8)
		lr, _ := a.Register("dst", dst)
		fs := make([]*Future, 20000)
		for j := range fs {
			fs[j] = p.Read([]Op{{Local: lr, Remote: rr, Len: 8}})
		}
		f := fs[len(fs)/2]
		res := make(chan error, 1)
		go func() { res <- f.Wait(context.Background()) }()
		eventually(t, "the Wait parked", func() bool { return f.ev.Load() != nil })
		p.l.fail(opErr("test", "evil", "", ErrPeerLost, "failed by the test"))
		err = <-res
		select {
		case <-f.Done():
		default:
			t.Fatalf("round %d: Wait returned %v before the Future was done", round, err)
		}
		if !errors.Is(err, ErrPeerLost) {
			t.Fatalf("round %d: %v, want ErrPeerLost", round, err)
		}
		a.Close()
	}
}

// TestWaitersShareConnection: many reads on one connection waited at
// once, from as many goroutines (one parks on the connection's waker,
// the others on their channels), each get their own bytes.
func TestWaitersShareConnection(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	_, b, ab, _ := pair(t, func(o *Options) { o.TCPOnly = true; o.Channels = 1 })
	src := make([]byte, 64<<10)
	fill(src, 3)
	sr, _ := b.Register("src", src)
	const n, rounds = 8, 200
	dst := make([]byte, len(src))
	dr, _ := ab.e.Register("dst", dst)
	errs := make(chan error, n)
	for i := range n {
		go func() {
			errs <- func() error {
				for r := range rounds {
					off := (i*rounds + r) * 8 % len(src)
					if err := ab.Read([]Op{{Local: dr, LocalOff: off, Remote: sr.Remote(), RemoteOff: off, Len: 8}}).Wait(ctx); err != nil {
						return err
					}
					if !bytes.Equal(dst[off:off+8], src[off:off+8]) {
						return fmt.Errorf("goroutine %d round %d: read %x, want %x", i, r, dst[off:off+8], src[off:off+8])
					}
				}
				return nil
			}()
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if parks := ab.l.conns[0].waker.parks.Load(); parks == 0 {
		t.Fatal("no Wait parked on the waker")
	}
}

// TestEndedByCancel: a context that is cancelled ends Imm, Connect and
// Deregister with ErrCancelled, one whose deadline passed with ErrTimeout,
// as it ends a Future's Wait: a caller that shuts down is not told that
// something timed out.
func TestEndedByCancel(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	_, st := storeFor(t)
	a := published(t, ctx, st, "a", func(o *Options) { o.Heartbeat = 20 * time.Second })
	// stalled registers a region and holds it with a write, from a peer
	// of its own, whose chunk stalls half-way: Deregister waits for it.
	stalled := func(t *testing.T, peer string) *Region {
		mem := make([]byte, 2*ChunkMax)
		r, _ := a.Register(peer, mem)
		rr := r.Remote()
		c := member(t, a, helloFrame(5, 0, 1, 20000, uint32(os.Getpid()), peer), 0)
		p := make([]byte, stripeSize+DescSize)
		(&desc{rr.ID, rr.Key, 0, uint64(len(mem))}).put(p[stripeSize:])
		c.Write(append(hdr(header{kind: kReq, sub: rWrite, id: 1, a: uint64(len(mem)), b: 1, payload: uint32(len(p))}), p...))
		c.Write(append(hdr(header{kind: kData, id: 1, payload: ChunkMax}), make([]byte, ChunkMax/2)...))
		eventually(t, "the write to start", func() bool {
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.refs > 0
		})
		return r
	}
	for _, tc := range []struct {
		name string
		ctx  func() context.Context
		want error
	}{
		{"cancelled", func() context.Context { c, cancel := context.WithCancel(ctx); cancel(); return c }, ErrCancelled},
		{"deadline", func() context.Context {
			c, cancel := context.WithTimeout(ctx, time.Millisecond)
			t.Cleanup(cancel)
			<-c.Done()
			return c
		}, ErrTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := a.Imm(tc.ctx()); !errors.Is(err, tc.want) {
				t.Errorf("Imm: %v, want %v", err, tc.want)
			}
			if _, err := a.Connect(tc.ctx(), "nobody"); !errors.Is(err, tc.want) {
				t.Errorf("Connect: %v, want %v", err, tc.want)
			}
			var oe *OpError
			if err := a.Deregister(tc.ctx(), stalled(t, "peer-"+tc.name)); !errors.Is(err, tc.want) || !errors.As(err, &oe) || oe.Peer != "peer-"+tc.name {
				t.Errorf("Deregister: %v, want %v naming peer-%s, whose write holds the region", err, tc.want, tc.name)
			}
		})
	}
}

// TestPeerImm: Endpoint.Imm takes the immediates in the order they
// arrived, across peers; Peer.Imm takes its link's alone, in order,
// leaving the others'. Once a link has failed (its connection closed, or
// its heartbeat), its queued immediates are still delivered, and then its
// Imm fails at once with ErrPeerLost naming the peer, also one already
// waiting; a link made again to the same name has immediates of its own.
func TestPeerImm(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	a := endpoint(t, ctx, Options{Name: "a", Auth: testAuth(), Channels: 1, Timeout: time.Minute, Heartbeat: 20 * time.Second})
	p1, c1, _ := fakeTarget(t, a)
	link := func(name string) (*Peer, net.Conn) {
		addr, got := fakeAcceptor(t, name)
		return fakeLink(t, ctx, a, info{name: name, addr: addr}, got)
	}
	p2, c2 := link("evil2")
	p3, c3 := link("evil3")
	imm := func(c net.Conn, id, v uint64) {
		t.Helper()
		c.Write(hdr(header{kind: kReq, sub: rImm, id: id, a: v}))
		if h, _ := nextFrame(t, c); h.kind != kResp || h.sub != rImm || h.status != stOK {
			t.Fatalf("the immediate was answered %+v", h)
		}
	}
	take := func(what string, from func(context.Context) (Imm, error), want Imm) {
		t.Helper()
		if im, err := from(ctx); err != nil || im != want {
			t.Fatalf("%s: %+v, %v; want %+v", what, im, err, want)
		}
	}
	// Across peers, in the order they arrived.
	imm(c1, 1, 1)
	imm(c2, 1, 2)
	imm(c3, 1, 3)
	imm(c1, 2, 4)
	imm(c2, 2, 5)
	for _, want := range []Imm{{"evil", 1}, {"evil2", 2}, {"evil3", 3}, {"evil", 4}, {"evil2", 5}} {
		take("Endpoint.Imm", a.Imm, want)
	}
	// One peer's, past the others'.
	imm(c1, 3, 6)
	imm(c2, 3, 7)
	take("evil2's", p2.Imm, Imm{"evil2", 7})
	take("the one left", a.Imm, Imm{"evil", 6})
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if im, err := p1.Imm(short); !errors.Is(err, ErrTimeout) {
		t.Fatalf("evil's Imm with none queued: %+v, %v; want ErrTimeout", im, err)
	}
	// Lost with an immediate queued: that one first, then the error; a
	// link made again under the name takes only its own.
	imm(c2, 4, 8)
	c2.Close()
	eventually(t, "evil2's link to fail", func() bool { return p2.l.failed() != nil })
	p2b, c2b := link("evil2")
	imm(c2b, 1, 9)
	take("the new link's", p2b.Imm, Imm{"evil2", 9})
	take("the old link's queued one", p2.Imm, Imm{"evil2", 8})
	var oe *OpError
	if _, err := p2.Imm(ctx); !errors.Is(err, ErrPeerLost) || !errors.As(err, &oe) || oe.Peer != "evil2" {
		t.Fatalf("evil2's Imm after its loss: %v; want ErrPeerLost naming it", err)
	}
	// A heartbeat's silence is a lost peer too, not a wait to try again.
	p3.l.fail(opErr("receiving", "evil3", "", ErrTimeout, "the link was silent for the heartbeat deadline"))
	if _, err := p3.Imm(ctx); !errors.Is(err, ErrPeerLost) || errors.Is(err, ErrTimeout) {
		t.Fatalf("evil3's Imm after its heartbeat failed: %v; want ErrPeerLost alone", err)
	}
	// Lost while one waits.
	res := make(chan error, 1)
	start := time.Now()
	go func() { _, err := p1.Imm(context.Background()); res <- err }()
	time.Sleep(50 * time.Millisecond)
	c1.Close()
	select {
	case err := <-res:
		if !errors.Is(err, ErrPeerLost) {
			t.Fatalf("a waiting Imm of a peer lost: %v after %v; want ErrPeerLost", err, time.Since(start))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a waiting Imm of a peer lost still waits after 5 s")
	}
	// A frame read ahead of a failed link's end queues nothing: its
	// Peer.Imm said ErrPeerLost already.
	if a.pushImm(p1.l.imm, 10) {
		t.Fatal("an immediate was queued after its link failed")
	}
	// Every queue taken is gone (none keeps its link alive).
	a.immMu.Lock()
	defer a.immMu.Unlock()
	if len(a.imms) != 0 || a.immN != 0 {
		t.Fatalf("%d queues of %d immediates left after all were taken", len(a.imms), a.immN)
	}
}

// stalledAcceptor listens and holds every connection without a word
// (auth false), or after the acceptor's side of the handshake (auth
// true), as a peer whose process is stopped or stuck does (the kernel
// still accepts its connections).
func stalledAcceptor(t *testing.T, proven bool) string {
	t.Helper()
	var handle func(net.Conn)
	if proven {
		handle = func(c net.Conn) {
			auth.Accept(c, auth.NewKey(testAuth().Secret, testAuth().Job), shakePurpose("stalled", c.LocalAddr().String()), time.Now().Add(5*time.Second))
		}
	}
	return testbin.Serve(t, handle)
}

// TestConnectStalledPeer: Connect to a peer that accepts the connection
// and then says nothing (in the handshake, or in answer to the hello)
// ends when its context does, with ErrTimeout at its deadline and
// ErrCancelled at once when it is cancelled, or with ErrTimeout at
// HandshakeTimeout; the error names the peer.
func TestConnectStalledPeer(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	a := endpoint(t, ctx, Options{Name: "a", Auth: testAuth(), Channels: 2, HandshakeTimeout: 4 * time.Second})
	short := endpoint(t, ctx, Options{Name: "s", Auth: testAuth(), Channels: 2, HandshakeTimeout: 300 * time.Millisecond})
	for _, tc := range []struct {
		how    string
		e      *Endpoint
		proven bool
		ctx    func() (context.Context, context.CancelFunc)
		want   error
	}{
		{"deadline in the handshake", a, false, func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 300*time.Millisecond) }, ErrTimeout},
		{"deadline in the hello", a, true, func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 300*time.Millisecond) }, ErrTimeout},
		{"cancel in the handshake", a, false, func() (context.Context, context.CancelFunc) {
			c, cancel := context.WithCancel(ctx)
			time.AfterFunc(300*time.Millisecond, cancel)
			return c, cancel
		}, ErrCancelled},
		{"cancel in the hello", a, true, func() (context.Context, context.CancelFunc) {
			c, cancel := context.WithCancel(ctx)
			time.AfterFunc(300*time.Millisecond, cancel)
			return c, cancel
		}, ErrCancelled},
		{"HandshakeTimeout", short, false, func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 10*time.Second) }, ErrTimeout},
		{"HandshakeTimeout in the hello", short, true, func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 10*time.Second) }, ErrTimeout},
	} {
		in := info{name: "stalled", addr: stalledAcceptor(t, tc.proven)}
		cctx, cancel := tc.ctx()
		t0 := time.Now()
		_, err := tc.e.ConnectInfo(cctx, in.encode())
		took := time.Since(t0)
		cancel()
		if !errors.Is(err, tc.want) || !isOp(err, "connect", "stalled") || took > 2*time.Second {
			t.Errorf("%s: %v after %v; want %v naming the peer, within 2 s", tc.how, err, took, tc.want)
		}
	}
}

// TestPartialSessionDropped: a session whose connector sent the hellos
// of some of its channels and never the rest (it gave up when the other
// end answered "dup" on a later one, or it died) is dropped, its
// connections closed, about twice HandshakeTimeout later, even when no
// other hello comes to sweep it.
func TestPartialSessionDropped(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	b := endpoint(t, ctx, Options{Name: "b", Auth: testAuth(), HandshakeTimeout: 200 * time.Millisecond})
	c := member(t, b, helloFrame(7, 0, 4, 20000, 0, "half"), 0) // channel 0 of 4, and no more
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var buf [64]byte
	for {
		_, err := c.Read(buf[:])
		if err == nil {
			continue
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatal("the endpoint still holds the connection of a session that never completed, 5 s later")
		}
		break
	}
}

// TestHeartbeatFloor: a link's heartbeat is at least minHeartbeat
// whatever the two ends' are, also where the peer's hello proposes none
// (0 ms, which no honest peer sends): an Options.Heartbeat below it is
// raised to it, and a heartbeat of a few nanoseconds cannot stop the
// link's pings (a ticker of a quarter of it).
func TestHeartbeatFloor(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	for _, peerMS := range []uint32{0, 1, 20000} {
		b := endpoint(t, ctx, Options{Name: "b", Auth: testAuth(), Heartbeat: 2})
		name := fmt.Sprint("hb", peerMS)
		member(t, b, helloFrame(5, 0, 1, peerMS, 0, name), 0)
		eventually(t, "the link", func() bool { return b.Peer(name) != nil })
		if hb := b.Peer(name).l.hb; hb != minHeartbeat {
			t.Errorf("a peer proposing %d ms to an endpoint of 2 ns: a heartbeat of %v, want %v", peerMS, hb, minHeartbeat)
		}
	}
}

// TestParkedBounded: connections of sessions that never complete (an
// authenticated member's hellos of a channel each, of ever new sessions)
// hold at most maxParked descriptors, each session counted with all the
// channels its hello names: a hello that would open another session past
// it is refused, and a waiting session still completes and links.
func TestParkedBounded(t *testing.T) {
	setLimit(t, &maxParked, 5) // two sessions of two channels fit, a third does not
	ctx := ctxT(t, 30*time.Second)
	b, err := New(ctx, Options{Name: "b", Auth: testAuth()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for s := range 2 {
		member(t, b, helloFrame(uint64(100+s), 0, 2, 1000, 1, "m"), 0)
	}
	c, err := net.Dial("tcp", b.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := auth.Connect(c, auth.NewKey(testAuth().Secret, testAuth().Job), shakePurpose(b.Name(), b.Addr()), time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	c.Write(helloFrame(999, 0, 2, 1000, 1, "m"))
	var ack [HeaderSize]byte
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, rerr := readFull(c, ack[:])
	h, derr := decodeHeader(ack[:])
	if rerr == nil && derr == nil && h.status == stOK {
		t.Fatalf("a hello of a new session past %d parked connections was accepted", maxParked)
	}
	t.Logf("past the bound: %v %v status %d", rerr, derr, h.status)
	// A parked session's second channel completes it.
	member(t, b, helloFrame(100, 1, 2, 1000, 1, "m"), 0)
}

// TestReadAnsweredOnNamedConnection: a read request names the connection
// of its answer (the stripes of one read are asked together on one
// connection): the target answers on that one, whichever carried the
// request; a request that names a connection the link does not have
// closes the link, having read nothing, and the endpoint goes on serving.
func TestReadAnsweredOnNamedConnection(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	b := endpoint(t, ctx, Options{Name: "b", Auth: testAuth()})
	mem := make([]byte, 4096)
	fill(mem, 7)
	r, _ := b.Register("m", mem)
	rr := r.Remote()
	var cs [2]net.Conn
	for ch := range cs {
		cs[ch] = member(t, b, helloFrame(31, uint32(ch), 2, 60000, 0, "evil"), 0)
	}
	read := func(id uint64, ch uint16, off, n uint64) []byte {
		p := make([]byte, stripeSize+DescSize)
		(&desc{rr.ID, rr.Key, off, n}).put(p[stripeSize:])
		return append(hdr(header{kind: kReq, sub: rRead, ch: ch, id: id, a: n, b: 1, payload: uint32(len(p))}), p...)
	}
	// Asked on connection 0, answered on 1: small (answered from the
	// reader) and large (queued for connection 1's writer).
	for i, n := range []uint64{100, 4096} {
		id := uint64(i + 1)
		cs[0].Write(read(id, 1, 0, n))
		h, _ := nextFrame(t, cs[1])
		if h.kind != kResp || h.sub != rRead || h.id != id || h.status != stOK || h.a != n {
			t.Fatalf("read %d: answered %+v on connection 1", id, h)
		}
		h, data := nextFrame(t, cs[1])
		if h.kind != kData || h.id != id || !bytes.Equal(data, mem[:n]) {
			t.Fatalf("read %d: data frame %+v with %d bytes, want the region's first %d", id, h, len(data), n)
		}
	}
	// A connection the link does not have: the link closes.
	cs[0].Write(read(9, 2, 0, 100))
	for ch, c := range cs {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		for {
			var buf [HeaderSize]byte
			_, err := readFull(c, buf[:])
			if err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) {
					t.Fatalf("connection %d still open after a read answered on connection 2 of 2", ch)
				}
				break
			}
			if h, _ := decodeHeader(buf[:]); h.kind != kPing {
				t.Fatalf("connection %d: %+v after a read answered on connection 2 of 2", ch, h)
			}
		}
	}
	a := endpoint(t, ctx, Options{Name: "a", Auth: testAuth()})
	ab, err := a.ConnectInfo(ctx, b.Info())
	if err != nil {
		t.Fatalf("an honest link after the hostile one: %v", err)
	}
	lr, _ := a.Register("l", make([]byte, 4096))
	if err := ab.Read([]Op{{Local: lr, Remote: rr, Len: 4096}}).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(lr.Bytes(), mem) {
		t.Fatal("the honest read differs")
	}
}
