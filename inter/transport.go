package inter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/rendezvous"
)

// Config describes one rank's transport.
type Config struct {
	Store *rendezvous.Client
	Key   string // store key prefix unique to the communicator
	Rank  int    // global rank
	// Peers are the global ranks this rank exchanges data with.
	Peers []int
	// Channels is the number of TCP connections per peer pair; a block is
	// striped across them.
	Channels int
	// IfName names the interface to listen on (SLIME_SOCKET_IFNAME); empty
	// picks the one that reaches MasterAddr.
	IfName     string
	MasterAddr string
	Timeout    time.Duration
	// SockBuf sizes each socket's send and receive buffers.
	SockBuf int
	// Lowat bounds the bytes a receive waits for before its reader wakes
	// (see Reader; default DefaultLowat; negative: the kernel's default,
	// one segment).
	Lowat int
}

// DefaultChannels and DefaultSockBuf are measured defaults (README).
const (
	DefaultChannels = 2
	DefaultSockBuf  = 4 << 20
	// DefaultLowat: across two namespaces, receives that wake per 4 MiB
	// instead of per segment carried 17–37% more (README).
	DefaultLowat = 4 << 20
)

// Transport is one rank's set of connections. Its operations are driven by
// one goroutine; each connection has a reader and a writer goroutine that
// take jobs from it.
type Transport struct {
	cfg   Config
	ln    net.Listener
	peers map[int]*peer
	addr  string
}

type peer struct {
	rank     int
	conns    []*conn
	sendDone chan error
	recvDone chan error
	// small transfers run in the caller's goroutine
	sendDirect, recvDirect bool
	sendErr                error
	recvJob                job
}

type conn struct {
	c     *net.TCPConn
	p     *peer
	me    uint32
	sendq chan job
	recvq chan job
	whdr  [HeaderSize]byte
	rhdr  [HeaderSize]byte
	vec   [2][]byte
	bufs  net.Buffers
	rd    Reader
}

type job struct {
	epoch, hash uint64
	buf         []byte
	deadline    time.Time
}

// ErrMismatch is what a receive returns (wrapped) when the sender's call
// differs from this rank's; the stream stays in step.
var ErrMismatch = fault.ErrSizeMismatch

// New listens, publishes its address through the store, and connects to
// every peer with cfg.Channels connections (the lower rank dials).
func New(ctx context.Context, cfg Config) (*Transport, error) {
	if cfg.Channels <= 0 {
		cfg.Channels = DefaultChannels
	}
	if cfg.Lowat == 0 {
		cfg.Lowat = DefaultLowat
	}
	if cfg.SockBuf <= 0 {
		cfg.SockBuf = DefaultSockBuf
	}
	ip, err := LocalIP(cfg.IfName, cfg.MasterAddr)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return nil, fmt.Errorf("inter: listen on %s: %w", ip, err)
	}
	t := &Transport{cfg: cfg, ln: ln, peers: map[int]*peer{}, addr: ln.Addr().String()}
	ok := false
	defer func() {
		if !ok {
			t.Close()
		}
	}()
	for _, p := range cfg.Peers {
		t.peers[p] = &peer{rank: p, conns: make([]*conn, cfg.Channels),
			sendDone: make(chan error, cfg.Channels), recvDone: make(chan error, cfg.Channels)}
	}
	if err := cfg.Store.Set(ctx, t.key(cfg.Rank), []byte(t.addr)); err != nil {
		return nil, err
	}
	accepts := 0
	for _, p := range cfg.Peers {
		if p < cfg.Rank {
			accepts += cfg.Channels
		}
	}
	acceptErr := make(chan error, 1)
	go func() { acceptErr <- t.acceptAll(ctx, accepts) }()
	for _, p := range cfg.Peers {
		if p > cfg.Rank {
			if err := t.dialPeer(ctx, p); err != nil {
				ln.Close()
				<-acceptErr
				return nil, err
			}
		}
	}
	if err := <-acceptErr; err != nil {
		return nil, err
	}
	for _, p := range t.peers {
		for _, c := range p.conns {
			go c.writer()
			go c.reader()
		}
	}
	ok = true
	return t, nil
}

func (t *Transport) key(r int) string { return t.cfg.Key + "/addr/" + strconv.Itoa(r) }

// Addr is the address this rank listens on.
func (t *Transport) Addr() string { return t.addr }

func (t *Transport) dialPeer(ctx context.Context, p int) error {
	v, err := t.cfg.Store.Get(ctx, t.key(p))
	if err != nil {
		return fault.New("connect", t.cfg.Rank, p, fault.ErrTimeout, "rank %d never published its address: %v", p, err)
	}
	addr := string(v)
	var d net.Dialer
	for ch := range t.cfg.Channels {
		var c net.Conn
		for {
			c, err = d.DialContext(ctx, "tcp", addr)
			if err == nil || ctx.Err() != nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			return fault.New("connect", t.cfg.Rank, p, fault.ErrTimeout, "dial %s: %v", addr, err)
		}
		tc := c.(*net.TCPConn)
		hello := Header{Kind: KindHello, Sender: uint32(t.cfg.Rank), Epoch: uint64(ch)}
		var b [HeaderSize]byte
		hello.Put(b[:])
		tc.SetDeadline(deadlineOf(ctx, t.cfg.Timeout))
		if _, err := tc.Write(b[:]); err != nil {
			tc.Close()
			return fault.New("connect", t.cfg.Rank, p, fault.ErrPeerLost, "hello to %s: %v", addr, err)
		}
		t.attach(tc, p, ch)
	}
	return nil
}

func (t *Transport) acceptAll(ctx context.Context, n int) error {
	deadline := deadlineOf(ctx, t.cfg.Timeout)
	for n > 0 {
		t.ln.(*net.TCPListener).SetDeadline(deadline)
		c, err := t.ln.Accept()
		if err != nil {
			var missing []int
			for _, p := range t.peers {
				if p.rank < t.cfg.Rank && p.conns[t.cfg.Channels-1] == nil {
					missing = append(missing, p.rank)
				}
			}
			return fault.New("connect", t.cfg.Rank, -1, fault.ErrTimeout, "ranks %v did not connect: %v", missing, err)
		}
		tc := c.(*net.TCPConn)
		tc.SetDeadline(deadline)
		var b [HeaderSize]byte
		if _, err := io.ReadFull(tc, b[:]); err != nil {
			tc.Close()
			continue // not one of ours, or it died: keep waiting for the real ones
		}
		h, err := Decode(b[:])
		p, known := t.peers[int(h.Sender)]
		if err != nil || h.Kind != KindHello || !known || int(h.Sender) > t.cfg.Rank || h.Epoch >= uint64(t.cfg.Channels) || p.conns[h.Epoch] != nil {
			tc.Close()
			continue
		}
		t.attach(tc, p.rank, int(h.Epoch))
		n--
	}
	return nil
}

func (t *Transport) attach(tc *net.TCPConn, p, ch int) {
	tc.SetNoDelay(true)
	tc.SetReadBuffer(t.cfg.SockBuf)
	tc.SetWriteBuffer(t.cfg.SockBuf)
	tc.SetDeadline(time.Time{})
	pr := t.peers[p]
	pr.conns[ch] = &conn{c: tc, p: pr, me: uint32(t.cfg.Rank), sendq: make(chan job, 1), recvq: make(chan job, 1),
		rd: NewReader(tc, t.cfg.Lowat)}
}

// callDeadline is when one call gives up: after timeout, or at the
// context's deadline if that comes first.
func callDeadline(ctx context.Context, timeout time.Duration) time.Time {
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	return deadline
}

func deadlineOf(ctx context.Context, d time.Duration) time.Time {
	if dl, ok := ctx.Deadline(); ok {
		return dl
	}
	return time.Now().Add(d)
}

// LocalIP is the address to listen on: that of the named interface, or
// the one this host uses to reach the master.
func LocalIP(ifname, master string) (string, error) {
	if ifname != "" {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return "", fmt.Errorf("inter: SLIME_SOCKET_IFNAME=%s: %w", ifname, err)
		}
		addrs, err := ifi.Addrs()
		if err != nil {
			return "", fmt.Errorf("inter: SLIME_SOCKET_IFNAME=%s: %w", ifname, err)
		}
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
				return ipn.IP.String(), nil
			}
		}
		return "", fmt.Errorf("inter: SLIME_SOCKET_IFNAME=%s has no IPv4 address", ifname)
	}
	if master == "" {
		master = "127.0.0.1"
	}
	// A UDP "connection" sends nothing; it asks the routing table which
	// local address reaches the master.
	c, err := net.Dial("udp", net.JoinHostPort(master, "9"))
	if err != nil {
		return "", fmt.Errorf("inter: no route to the master %s: %w", master, err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP.String(), nil
}

// Close closes every connection; the goroutines end with them.
func (t *Transport) Close() error {
	if t.ln != nil {
		t.ln.Close()
	}
	for _, p := range t.peers {
		for _, c := range p.conns {
			if c != nil {
				c.c.Close()
				close(c.sendq)
				close(c.recvq)
			}
		}
	}
	t.peers = nil
	return nil
}

// DirectMax is the largest block sent and received in the caller's
// goroutine: one frame on the first connection, no hand-off to the
// connection goroutines (each hand-off costs a wake-up).
const DirectMax = 64 << 10

// stripe is channel ch's part of a block of n bytes. Every message puts
// exactly one frame on every connection (empty ones included), so that the
// streams stay in step even when the two ends disagree about n.
func stripe(n, channels, ch int) (lo, hi int) {
	if n <= DirectMax {
		if ch == 0 {
			return 0, n
		}
		return n, n
	}
	per := (n + channels - 1) / channels
	lo = min(ch*per, n)
	return lo, min(lo+per, n)
}

// Send starts sending buf to peer p; WaitSend collects the result.
func (t *Transport) Send(p int, epoch, hash uint64, buf []byte, deadline time.Time) {
	pr := t.peers[p]
	pr.sendDirect = len(buf) <= DirectMax
	for ch, c := range pr.conns {
		lo, hi := stripe(len(buf), len(pr.conns), ch)
		j := job{epoch: epoch, hash: hash, buf: buf[lo:hi], deadline: deadline}
		if !pr.sendDirect {
			c.sendq <- j
		} else if err := c.send(j); err != nil && pr.sendErr == nil {
			pr.sendErr = err
		}
	}
}

// Recv starts receiving len(buf) bytes from peer p into buf; WaitRecv
// collects the result.
func (t *Transport) Recv(p int, epoch, hash uint64, buf []byte, deadline time.Time) {
	pr := t.peers[p]
	pr.recvDirect = len(buf) <= DirectMax
	j := job{epoch: epoch, hash: hash, buf: buf, deadline: deadline}
	if pr.recvDirect {
		pr.recvJob = j
		return
	}
	for ch, c := range pr.conns {
		lo, hi := stripe(len(buf), len(pr.conns), ch)
		j.buf = buf[lo:hi]
		c.recvq <- j
	}
}

// WaitSend and WaitRecv return the first error of the transfer with peer
// p, waiting for all of its connections.
func (t *Transport) WaitSend(p int) error {
	pr := t.peers[p]
	if pr.sendDirect {
		err := pr.sendErr
		pr.sendErr = nil
		return err
	}
	return wait(pr.sendDone, len(pr.conns))
}

func (t *Transport) WaitRecv(p int) error {
	pr := t.peers[p]
	if !pr.recvDirect {
		return wait(pr.recvDone, len(pr.conns))
	}
	var first error
	j := pr.recvJob
	for ch, c := range pr.conns {
		lo, hi := stripe(len(j.buf), len(pr.conns), ch)
		part := j
		part.buf = j.buf[lo:hi]
		if err := c.receive(part); err != nil {
			if !errors.Is(err, ErrMismatch) {
				return err
			}
			if first == nil {
				first = err
			}
		}
	}
	return first
}

func wait(done chan error, n int) error {
	var first error
	for range n {
		if err := <-done; err != nil && (first == nil || errors.Is(first, ErrMismatch)) {
			first = err
		}
	}
	return first
}

func (c *conn) writer() {
	for j := range c.sendq {
		c.p.sendDone <- c.send(j)
	}
}

// send writes one frame: header and payload in one vectored write.
func (c *conn) send(j job) error {
	h := Header{Kind: KindData, Sender: c.me, Epoch: j.epoch, Hash: j.hash, Count: uint64(len(j.buf))}
	h.Put(c.whdr[:])
	c.c.SetWriteDeadline(j.deadline)
	c.vec[0], c.vec[1] = c.whdr[:], j.buf
	c.bufs = c.vec[:]
	_, err := c.bufs.WriteTo(c.c)
	return c.classify(err, "sending")
}

func (c *conn) reader() {
	for j := range c.recvq {
		c.p.recvDone <- c.receive(j)
	}
}

func (c *conn) receive(j job) error {
	c.c.SetReadDeadline(j.deadline)
	if err := c.rd.ReadFull(c.rhdr[:]); err != nil {
		return c.classify(err, "receiving a header")
	}
	h, err := Decode(c.rhdr[:])
	if err != nil {
		return fmt.Errorf("%w: from rank %d: %v", fault.ErrPeerLost, c.p.rank, err)
	}
	if h.Kind != KindData || int(h.Sender) != c.p.rank || h.Epoch != j.epoch {
		return fmt.Errorf("%w: rank %d's stream is out of step (call %d from rank %d, want call %d)", fault.ErrPeerLost, c.p.rank, h.Epoch, h.Sender, j.epoch)
	}
	if h.Hash != j.hash || h.Count != uint64(len(j.buf)) {
		// Drain the payload so that the stream stays in step.
		c.rd.SetLowat(1) // the header's read may have left it higher
		if _, err := io.CopyN(io.Discard, c.c, int64(h.Count)); err != nil {
			return c.classify(err, "draining a mismatched block")
		}
		if h.Count != uint64(len(j.buf)) {
			return fmt.Errorf("%w: rank %d sent %d bytes, this rank expected %d", ErrMismatch, c.p.rank, h.Count, len(j.buf))
		}
		return fmt.Errorf("%w: rank %d's call differs from this rank's (the operation, or a size on some rank)", ErrMismatch, c.p.rank)
	}
	if err := c.rd.ReadFull(j.buf); err != nil {
		return c.classify(err, "receiving a block")
	}
	return nil
}

// classify maps a socket error to the project's errors.
func (c *conn) classify(err error, what string) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("%w: %s from rank %d", fault.ErrTimeout, what, c.p.rank)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, net.ErrClosed):
		return fmt.Errorf("%w: connection to rank %d closed while %s", fault.ErrPeerLost, c.p.rank, what)
	}
	return fmt.Errorf("%w: %s, rank %d: %v", fault.ErrPeerLost, what, c.p.rank, err)
}
