package inter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/slimego/slimego/internal/auth"
	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/internal/netaddr"
	"github.com/slimego/slimego/internal/raceio"
	"github.com/slimego/slimego/rendezvous"
)

// Config describes one rank's transport.
type Config struct {
	Store *rendezvous.Client
	Key   string // store key prefix unique to the communicator
	Rank  int    // global rank
	// World is the number of ranks in the job: a rank read from the
	// store (a failure record, see Explain) is checked against it
	// (0: against MaxRank only).
	World int
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
	// SockBuf sizes each socket's send buffer. Receive buffers are left to
	// the kernel's autotuning: a receive buffer set by the program is
	// locked, and when its reader falls behind on a busy host the kernel
	// drops what no longer fits (receive-queue prunes) and the sender waits
	// out a retransmission timeout, which stretched large all-gathers to
	// more than twice their length (docs/PERFORMANCE.md).
	SockBuf int
	// Lowat bounds the bytes a receive waits for before its reader wakes
	// (see Reader; default DefaultLowat; negative: the kernel's default,
	// one segment).
	Lowat int
	// SendCopyMin is the least block whose out-of-place copy into the
	// rank's own place rides with its first send (SendCopy) where the
	// algorithm allows it (default DefaultSendCopyMin; negative: never).
	SendCopyMin int
	// Auth is the job's key (collective passes auth.NewKey(JobSecret,
	// RunID)). Every connection proves with it, both ways and before its
	// hello, that its two ends belong to the job; one that fails is
	// closed and does not count. The zero Key binds nothing and proves
	// nothing.
	Auth auth.Key
	// HandshakeTimeout bounds one connection's handshake and hello
	// (default DefaultHandshakeTimeout; never beyond New's deadline).
	HandshakeTimeout time.Duration
	// PollMax bounds how long a receive in the caller's goroutine (Direct)
	// polls its socket before it parks in the netpoller (see Reader;
	// default DefaultPollMax; negative: never polls). A node whose ranks
	// outnumber its cores sets it negative: there the peer awaited may
	// need the very core that would poll.
	PollMax time.Duration
}

// Connection setup.
const (
	// DefaultHandshakeTimeout: a peer that is up answers in a round trip;
	// a connection that has not proven itself by then is not one.
	DefaultHandshakeTimeout = 5 * time.Second
	// MaxPendingHandshakes bounds the accepted connections whose handshake
	// is under way; New closes those beyond at once (a real peer's dialer
	// retries).
	MaxPendingHandshakes = 64
	// DefaultConnectTimeout bounds New when neither its context nor
	// Config.Timeout does.
	DefaultConnectTimeout = 5 * time.Minute
	// purpose tells transport connections from the store's in the
	// handshake (shakePurpose adds the listener's key, rank and address).
	purpose = "transport"
)

// shakePurpose is the handshake's purpose on a connection to rank r of the
// communicator whose store keys start with key, listening at addr (as it
// published it): "transport:", the key, the rank, "@" and the address,
// which the acceptor proves to be its own. With the job alone proven,
// whoever holds a port that a member dials (the address a rank published
// before it died, its port free) could hand the dialer's challenge to any
// member's listener, the dialer's own included, pass its proofs back, and
// then, holding no secret, stand for the rank dialed (and say in a hello
// to that listener that it is another). With the rank alone, it could
// still hand it to that rank of another communicator of the job (a
// sub-group, the GPU path's second transport, another attempt) listening
// at the same time; the key and the address tie the proof to the one
// listener the dialer read from the store.
func shakePurpose(key string, r int, addr string) string {
	return purpose + ":" + key + ":" + strconv.Itoa(r) + "@" + addr
}

var (
	// ErrDenied: a connection failed the transport's handshake (its other
	// end does not hold the job's key) or named a rank and channel that
	// were not expected.
	ErrDenied = errors.New("inter: the transport handshake failed")
	// ErrBadAddress: a peer's published address is not a literal ip:port.
	ErrBadAddress = errors.New("inter: published address is not a literal ip:port")
)

// Transport defaults, each chosen by measurement (docs/PERFORMANCE.md).
const (
	// DefaultChannels: with messages under StripeMin on one connection,
	// more connections cost small messages nothing, and four carried
	// large messages faster than two.
	DefaultChannels = 4
	DefaultSockBuf  = 4 << 20
	// DefaultLowat: receives that wake once per 4 MiB instead of once per
	// segment spend less of a CPU-bound link's processor on wake-ups, and
	// carried more (see Reader).
	DefaultLowat = 4 << 20
	// DefaultSendCopyMin: a separate copy of a block that the caches hold
	// costs little; a block too large for them is read from memory once
	// for the send and again for the copy, and Go's copy slows as blocks
	// outgrow the caches. From 32 MiB the copy rides with the send, which
	// reads each piece once; below, riding gained nothing out of place and
	// slowed the in-place calls that followed (probably because the
	// riding copy's cached stores leave the result's lines dirty).
	DefaultSendCopyMin = 32 << 20
)

// Transport is one rank's set of connections. Its operations are driven by
// one goroutine; each connection has a reader and a writer goroutine that
// take jobs from it.
type Transport struct {
	cfg   Config
	ln    net.Listener
	peers map[int]*peer
	addr  string
	// direct is the largest message sent and received in the caller's
	// goroutine (see DirectMax).
	direct int
	// lost is the first transfer failure that lost a peer (lose), which
	// interrupted the link; interrupted is set by Interrupt, after which
	// failures are its consequence and not recorded.
	lost        atomic.Pointer[loss]
	interrupted atomic.Bool
	// losing is set by the first loss, whose goroutine then explains it
	// (Explain) before it sets lost and closes explained: Lost waits for
	// that, so that no failure names a peer the loss would not.
	losing    atomic.Bool
	explained chan struct{}
	// recorded and what follows, under recordMu, are this rank's failure
	// record (Record); goneBy bounds the look-ups of Explain
	// (GoneTimeout, goneWait).
	recordMu      sync.Mutex
	recorded      *goneRecord // the record written, nil before
	recordedFinal bool        // it was an explanation (Explain's), not to be written again
	goneMu        sync.Mutex
	goneBy        time.Time
	goneWaited    bool // goneBy was pushed to goneWait once
	// watch makes a cancellation of a call's context end the call
	// (cancel.go).
	watch watch
}

// loss is a transfer's failure with peer.
type loss struct {
	peer int
	err  error
}

type peer struct {
	t        *Transport
	rank     int
	conns    []*conn
	sendDone chan error
	recvDone chan error
	// small transfers run in the caller's goroutine
	sendDirect, recvDirect bool
	sendN                  int // frames the send in flight put on connections
	sendErr                error
	recvJob                job
	rest                   []job // the frames after the first of the message being received
}

type conn struct {
	c     *net.TCPConn
	p     *peer
	me    uint32
	sendq chan job
	recvq chan job
	done  chan struct{} // closed by Close: the reader goroutine ends
	whdr  [HeaderSize]byte
	rhdr  [HeaderSize]byte
	vec   [2][]byte
	bufs  net.Buffers
	rd    Reader
	// sendNow's vectored write, made once (see sendNow)
	wrc       syscall.RawConn
	writeFn   func(fd uintptr) bool
	iov       [2]unix.Iovec
	iovAt     int // the first iov entry not yet written
	wErr      error
	wDeadline time.Time
	wArmed    bool // the socket's write deadline is set to wDeadline
}

type job struct {
	epoch, hash uint64
	buf         []byte
	deadline    time.Time
	// sending: the message's total and stripes, for the header
	total, stripes int
	// receiving on a connection after the first: the first frame's header
	// said the sender's message differs, so drain this frame
	drain bool
	lead  bool // receiving the first frame: dispatch the others
	// sending: where the payload is also copied (SendCopy), or nil
	also []byte
}

// ErrMismatch is what a receive returns (wrapped) when the sender's call
// differs from this rank's; the stream stays in step.
var ErrMismatch = fault.ErrSizeMismatch

// ErrCallsDiffer is the ErrMismatch (errors.Is) of a frame whose call
// differs from the one the receiver expects: hier and the ring pass it
// on, so that every rank of the job returns it from the same call.
// Package collective then asks the ranks what each called, to name the
// one that differs.
var ErrCallsDiffer error = callsDiffer{}

type callsDiffer struct{}

func (callsDiffer) Error() string { return ErrMismatch.Error() }
func (callsDiffer) Unwrap() error { return ErrMismatch }

// New listens, publishes its address through the store, and connects to
// every peer with cfg.Channels connections (the lower rank dials). Every
// connection first proves, both ways, that its two ends hold cfg.Auth
// and that its acceptor is the rank dialed (internal/auth, purpose
// "transport:", the key, that rank and its address: shakePurpose); one
// that fails is closed and does not
// count. New gives up at connectDeadline(ctx, cfg.Timeout), and every
// goroutine it started has ended when it returns an error.
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
	if cfg.SendCopyMin == 0 {
		cfg.SendCopyMin = DefaultSendCopyMin
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.PollMax == 0 {
		cfg.PollMax = DefaultPollMax
	}
	cfg.PollMax = max(cfg.PollMax, 0)
	ctx, cancel := context.WithDeadline(ctx, connectDeadline(ctx, cfg.Timeout))
	defer cancel()
	ip, err := netaddr.ListenIP(cfg.IfName, cfg.MasterAddr, true)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return nil, fmt.Errorf("inter: listen on %s: %w", ip, err)
	}
	t := &Transport{cfg: cfg, ln: ln, peers: map[int]*peer{}, addr: ln.Addr().String(), explained: make(chan struct{})}
	ok := false
	defer func() {
		if !ok {
			t.Close()
		}
	}()
	for _, p := range cfg.Peers {
		t.peers[p] = &peer{t: t, rank: p, conns: make([]*conn, cfg.Channels), rest: make([]job, cfg.Channels),
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
	actx, stopAccepting := context.WithCancel(ctx)
	defer stopAccepting()
	acceptErr := make(chan error, 1)
	go func() { acceptErr <- t.acceptAll(actx, accepts) }()
	for _, p := range cfg.Peers {
		if p > cfg.Rank {
			if err := t.dialPeer(ctx, p); err != nil {
				stopAccepting()
				<-acceptErr
				return nil, err
			}
		}
	}
	if err := <-acceptErr; err != nil {
		return nil, err
	}
	t.direct = DirectMax
	for _, p := range t.peers {
		for _, c := range p.conns {
			t.direct = min(t.direct, sendBuffer(c.c)/4)
			go c.writer()
			go c.reader()
		}
	}
	ok = true
	return t, nil
}

// sendBuffer is the kernel's send buffer of c in bytes (SO_SNDBUF: twice
// what was asked, as capped by net.core.wmem_max), or 0 if it cannot say.
func sendBuffer(c *net.TCPConn) int {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	rc.Control(func(fd uintptr) {
		n, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF)
	})
	return n
}

func (t *Transport) key(r int) string { return t.cfg.Key + "/addr/" + strconv.Itoa(r) }

// Addr is the address this rank listened on while it connected.
func (t *Transport) Addr() string { return t.addr }

// parseAddr checks that s, the address a peer published in the store, is a
// literal ip:port with a port in 1–65535, and returns it. Nothing else read
// from the store is dialed: a host name would be looked up (and could point
// anywhere), and a malformed value would only be retried until the deadline.
func parseAddr(s string) (string, error) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		why := "malformed"
		if ae, ok := err.(*net.AddrError); ok {
			why = ae.Err // without the address, which may be long
		}
		return "", fmt.Errorf("%w: %.64q: %s", ErrBadAddress, s, why)
	}
	if net.ParseIP(host) == nil {
		return "", fmt.Errorf("%w: %.64q: %.64q is not an IP address", ErrBadAddress, s, host)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return "", fmt.Errorf("%w: %.64q: port %.16q is not in 1–65535", ErrBadAddress, s, port)
	}
	return s, nil
}

// dialPeer makes this rank's cfg.Channels connections to the higher peer
// p, at the address p published: each is dialed, proves the job's key both
// ways, and says which rank and channel it is (the hello).
func (t *Transport) dialPeer(ctx context.Context, p int) error {
	v, err := t.cfg.Store.Get(ctx, t.key(p))
	var ae *rendezvous.AbortError
	switch {
	case err == nil:
	case errors.As(err, &ae) || errors.Is(err, rendezvous.ErrConnLost) || errors.Is(err, rendezvous.ErrDenied) ||
		errors.Is(err, rendezvous.ErrBadAnswer) || errors.Is(err, context.Canceled):
		// The store's own failure (an abort says who and why): kept as
		// the cause, for the caller to name (collective's storeFault).
		return fault.New("connect", t.cfg.Rank, p, err, "reading rank %d's address from the store", p)
	default:
		return fault.New("connect", t.cfg.Rank, p, fault.ErrTimeout, "rank %d never published its address: %v", p, err)
	}
	addr, err := parseAddr(string(v))
	if err != nil {
		return fault.New("connect", t.cfg.Rank, p, err, "the address published for rank %d", p)
	}
	for ch := range t.cfg.Channels {
		tc, err := t.dialOne(ctx, p, addr)
		if err != nil {
			return err
		}
		hello := Header{Kind: KindHello, Sender: uint32(t.cfg.Rank), Epoch: uint64(ch)}
		var b [HeaderSize]byte
		hello.Put(b[:])
		tc.SetDeadline(t.handshakeDeadline(ctx))
		if _, err := tc.Write(b[:]); err != nil {
			tc.Close()
			return fault.New("connect", t.cfg.Rank, p, fault.ErrPeerLost, "hello to %s: %v", addr, err)
		}
		t.attach(tc, p, ch)
	}
	return nil
}

// dialOne dials peer p at addr and runs the connector's side of the
// handshake. It retries, until ctx ends, what a peer that is coming up or
// shedding load does: a dial refused, reset or unanswered (a SYN dropped
// by a full accept queue), or a handshake dropped before a verdict (an
// acceptor with MaxPendingHandshakes under way closes new connections at
// once, and evicts the oldest). A listener whose answer refuses the
// handshake (auth.ErrRefused) is final: it does not hold the job's key,
// so it is not rank p; so is a handshake that runs out of time.
func (t *Transport) dialOne(ctx context.Context, p int, addr string) (*net.TCPConn, error) {
	// Each attempt is short: a SYN lost to a full accept queue (a flood of
	// foreign connections, say) is retried by the kernel only after 1, 3,
	// 7 s, so a fresh attempt gets in sooner.
	d := net.Dialer{Timeout: time.Second}
	wait := 10 * time.Millisecond
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		switch {
		case err == nil:
			tc := c.(*net.TCPConn)
			w := &watchConn{Conn: tc}
			err = auth.Connect(w, t.cfg.Auth, shakePurpose(t.cfg.Key, p, addr), t.handshakeDeadline(ctx))
			if err == nil {
				return tc, nil
			}
			tc.Close()
			if w.timedOut() {
				return nil, fault.New("connect", t.cfg.Rank, p, fault.ErrTimeout, "the listener at %s did not finish the handshake by the deadline (%v): %v", addr, t.cfg.HandshakeTimeout, err)
			}
			if errors.Is(err, auth.ErrNotUser) {
				return nil, fault.New("connect", t.cfg.Rank, p, fmt.Errorf("%w: %w", ErrDenied, err), "the listener at %s, published as rank %d's, and this rank are different users' processes", addr, p)
			}
			if errors.Is(err, auth.ErrRefused) {
				return nil, fault.New("connect", t.cfg.Rank, p, fmt.Errorf("%w: %w", ErrDenied, err), "the listener at %s, published as rank %d's, does not prove to be rank %d of this job (another job's, or its port another process's since rank %d left it)", addr, p, p, p)
			}
			// Dropped before a verdict (an acceptor with its handshakes
			// full, one evicting its oldest, one closing): again.
		case ctx.Err() != nil:
		case !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, os.ErrDeadlineExceeded) && !timedOut(err):
			return nil, fault.New("connect", t.cfg.Rank, p, fault.ErrPeerLost, "dial %s: %v", addr, err)
		}
		if ctx.Err() != nil {
			return nil, fault.New("connect", t.cfg.Rank, p, ctxErr(ctx), "rank %d at %s did not accept a connection: %v", p, addr, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
}

// timedOut reports whether err is a dial attempt's own timeout
// (net.Dialer's Timeout, which is not os.ErrDeadlineExceeded): its SYN
// went unanswered, as one dropped by a full accept queue is.
func timedOut(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// watchConn records a handshake's first read error, so that a dialer can
// tell a handshake that ran out of time from one dropped or refused.
type watchConn struct {
	net.Conn
	err error // the first read error
}

func (w *watchConn) Read(b []byte) (int, error) {
	n, err := w.Conn.Read(b)
	if err != nil && w.err == nil {
		w.err = err
	}
	return n, err
}

func (w *watchConn) timedOut() bool { return errors.Is(w.err, os.ErrDeadlineExceeded) }

// handshakeDeadline is when one connection's handshake and hello must be
// done: HandshakeTimeout from now, or ctx's deadline if that comes first.
func (t *Transport) handshakeDeadline(ctx context.Context) time.Time {
	return callDeadline(ctx, t.cfg.HandshakeTimeout)
}

// acceptAll accepts until n connections from the lower peers have passed
// the handshake and each named, in its hello, a rank and channel that are
// expected and not yet connected; any other connection is closed and does
// not count. Each accepted connection's handshake and hello run in a
// goroutine of their own bounded by HandshakeTimeout, so that foreign, idle
// or garbage connections never hold up the real ones; at most
// MaxPendingHandshakes run at once, and connections beyond are closed at
// once. When acceptAll returns (done, at ctx's end, or when New stops it)
// the listener and every connection still in its handshake are closed, and
// every goroutine it started has ended.
// EvictAfter is how long a handshake must have lasted before a new
// connection may take its place when MaxPendingHandshakes are under way: a
// real peer answers within a round trip, so a flood of silent connections
// cannot hold the real peers out for the handshake's whole deadline.
const EvictAfter = 500 * time.Millisecond

// evictOldest closes the oldest of pending if it has lasted EvictAfter
// (its handshake then fails, and its goroutine removes it).
func evictOldest(pending map[*net.TCPConn]time.Time) {
	var oldest *net.TCPConn
	var at time.Time
	for c, t := range pending {
		if oldest == nil || t.Before(at) {
			oldest, at = c, t
		}
	}
	if oldest != nil && time.Since(at) >= EvictAfter {
		oldest.Close()
		delete(pending, oldest)
	}
}

func (t *Transport) acceptAll(ctx context.Context, n int) error {
	ln := t.ln.(*net.TCPListener)
	defer ln.Close()
	if n == 0 {
		return nil
	}
	type greeted struct {
		c *net.TCPConn
		h Header
	}
	got := make(chan greeted)
	stop := make(chan struct{})
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		pending  = map[*net.TCPConn]time.Time{} // when each was accepted
		stopped  bool
		refused  int
		lastFail error
	)
	fail := func(err error) {
		mu.Lock()
		refused++
		lastFail = err
		mu.Unlock()
	}
	defer func() {
		mu.Lock()
		stopped = true
		for c := range pending {
			c.Close()
		}
		mu.Unlock()
		close(stop)
		ln.Close()
		wg.Wait()
	}()
	if dl, ok := ctx.Deadline(); ok {
		ln.SetDeadline(dl)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				if errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrDeadlineExceeded) {
					return
				}
				select { // out of descriptors, say: let the pending ones finish
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
				continue
			}
			tc := c.(*net.TCPConn)
			mu.Lock()
			if !stopped && len(pending) >= MaxPendingHandshakes {
				evictOldest(pending)
			}
			if stopped || len(pending) >= MaxPendingHandshakes {
				mu.Unlock()
				tc.Close()
				continue
			}
			pending[tc] = time.Now()
			wg.Add(1)
			mu.Unlock()
			go func() {
				defer wg.Done()
				h, err := t.greet(ctx, tc)
				mu.Lock()
				delete(pending, tc)
				mu.Unlock()
				if err != nil {
					tc.Close()
					fail(err)
					return
				}
				select {
				case got <- greeted{tc, h}:
				case <-stop:
					tc.Close()
				}
			}()
		}
	}()
	for n > 0 {
		select {
		case g := <-got:
			p, known := t.peers[int(g.h.Sender)]
			if !known || p.rank >= t.cfg.Rank || g.h.Epoch >= uint64(t.cfg.Channels) || p.conns[g.h.Epoch] != nil {
				g.c.Close()
				fail(fmt.Errorf("%w: a connection named rank %d channel %d, which is not expected or already connected", ErrDenied, g.h.Sender, g.h.Epoch))
				continue
			}
			t.attach(g.c, p.rank, int(g.h.Epoch))
			n--
		case <-ctx.Done():
			var missing []int
			for _, p := range t.peers {
				if p.rank < t.cfg.Rank && slices.Contains(p.conns, nil) {
					missing = append(missing, p.rank)
				}
			}
			slices.Sort(missing)
			peer := -1
			if len(missing) == 1 {
				peer = missing[0]
			}
			mu.Lock()
			detail := fmt.Sprintf("ranks %v did not connect", missing)
			if refused > 0 {
				detail += fmt.Sprintf("; %d other connections were refused, the last: %v", refused, lastFail)
			}
			mu.Unlock()
			return fault.New("connect", t.cfg.Rank, peer, ctxErr(ctx), "%s", detail)
		}
	}
	return nil
}

// greet runs the acceptor's side of one connection: the handshake, then
// the hello that names the peer's rank and channel, both within
// HandshakeTimeout (or by ctx's deadline, if that comes first).
func (t *Transport) greet(ctx context.Context, c *net.TCPConn) (Header, error) {
	deadline := t.handshakeDeadline(ctx)
	if err := auth.Accept(c, t.cfg.Auth, shakePurpose(t.cfg.Key, t.cfg.Rank, t.addr), deadline); err != nil {
		return Header{}, fmt.Errorf("%w: %s: %w", ErrDenied, c.RemoteAddr(), err)
	}
	c.SetDeadline(deadline)
	var b [HeaderSize]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return Header{}, fmt.Errorf("%w: %s passed the handshake, then sent no hello: %v", ErrDenied, c.RemoteAddr(), err)
	}
	h, err := Decode(b[:])
	if err == nil && h.Kind != KindHello {
		err = fmt.Errorf("%w: kind %d, want a hello", ErrFrame, h.Kind)
	}
	if err != nil {
		return Header{}, fmt.Errorf("%w: %s passed the handshake, then sent a bad hello: %w", ErrDenied, c.RemoteAddr(), err)
	}
	return h, nil
}

// ctxErr is the error a wait that ctx ended reports: ErrTimeout at its
// deadline, else ctx's own error.
func ctxErr(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fault.ErrTimeout
	}
	return ctx.Err()
}

func (t *Transport) attach(tc *net.TCPConn, p, ch int) {
	tc.SetNoDelay(true)
	tc.SetWriteBuffer(t.cfg.SockBuf)
	tc.SetDeadline(time.Time{})
	pr := t.peers[p]
	c := &conn{c: tc, p: pr, me: uint32(t.cfg.Rank), sendq: make(chan job, 1), recvq: make(chan job, 1),
		done: make(chan struct{}), rd: NewReader(tc, t.cfg.Lowat)}
	c.rd.bind()
	c.rd.PollMax, c.rd.spin = t.cfg.PollMax, t.cfg.PollMax/2
	if rc, err := tc.SyscallConn(); err == nil {
		c.wrc = rc
		c.writeFn = c.writev
	}
	pr.conns[ch] = c
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

// connectDeadline is when New gives up: timeout from now, or at the
// context's deadline if that comes first; either alone where the other is
// unset, and DefaultConnectTimeout from now where both are.
func connectDeadline(ctx context.Context, timeout time.Duration) time.Time {
	if timeout <= 0 {
		timeout = DefaultConnectTimeout
		if dl, ok := ctx.Deadline(); ok {
			return dl
		}
	}
	return callDeadline(ctx, timeout)
}

// LocalIP is the address to listen on: that of the named interface, or
// the one this host uses to reach the master (see netaddr.LocalIP).
func LocalIP(ifname, master string) (string, error) { return netaddr.LocalIP(ifname, master) }

// Interrupt closes every connection, and with them the transfers in
// flight, which end at once with an error: what an algorithm does, once
// it has failed, before it collects the transfers it started (the
// transport is of no use then; Close still releases the rest). The
// transport does it itself when a transfer loses its peer (Lost).
func (t *Transport) Interrupt() {
	t.interrupted.Store(true)
	for _, p := range t.peers {
		for _, c := range p.conns {
			if c != nil {
				c.c.Close()
			}
		}
	}
}

// Lost reports the transfer failure that lost a peer (fault.ErrPeerLost:
// its connection closed or reset, its stream out of step) and with it
// the call: the first one, from the goroutine that met it, as Explain
// tells it (the peer named is the rank held responsible, where the peer
// lost gave up because of another). The transport then interrupted
// itself, ending the transfers still waiting for other peers, which fail
// as a consequence: their errors name the peer they waited for, Lost the
// one that was lost. A failure after Interrupt is not recorded (the
// interrupt caused it). err is nil while no peer was lost.
func (t *Transport) Lost() (peer int, err error) {
	if t.losing.Load() && t.explained != nil {
		<-t.explained // bounded: Explain's look-ups, a Record
	}
	if l := t.lost.Load(); l != nil {
		return l.peer, l.err
	}
	return -1, nil
}

// lose returns err, a transfer's result with peer p, after recording it
// as the link's loss and interrupting the link, where it is the first
// peer lost (see Lost). Without it a call that had lost one peer went on
// waiting for another, a late one, up to the call's deadline. The peer
// lost is recorded (Record) before the link is interrupted; the loss is
// explained, and the explanation recorded, before Lost answers.
func (p *peer) lose(err error) error {
	t := p.t
	if err == nil || !errors.Is(err, fault.ErrPeerLost) || t.interrupted.Load() || !t.losing.CompareAndSwap(false, true) {
		return err
	}
	// Recorded before the interrupt, for the ranks that see this one go;
	// explained after it, so that they see it at once.
	t.Record(p.rank, err)
	t.Interrupt()
	who, why := t.Explain(p.rank, err)
	t.lost.Store(&loss{who, why})
	t.Record(who, why)
	if t.explained != nil {
		close(t.explained)
	}
	return err
}

// Close closes every connection; the goroutines end with them.
func (t *Transport) Close() error {
	t.closeWatch()
	if t.ln != nil {
		t.ln.Close()
	}
	for _, p := range t.peers {
		for _, c := range p.conns {
			if c != nil {
				c.c.Close()
				close(c.sendq)
				close(c.done)
			}
		}
	}
	t.peers = nil
	return nil
}

// DirectMax is the largest message sent and received in the caller's
// goroutine: one frame on the first connection, written before the
// receive is read, with no hand-off to the connection goroutines (each
// hand-off costs a wake-up). A message up to StripeMin travels as one
// frame on one connection anyway; taking the direct path for all of them,
// rather than only below 64 KiB, made all-gathers of 128–512 KiB faster
// (docs/PERFORMANCE.md). The write must not wait for the peer to read, so a
// transport sends directly only what a quarter of its sockets' send
// buffers holds (Direct).
const DirectMax = StripeMin

// Direct says whether a message of n bytes is sent and received in the
// caller's goroutine.
func (t *Transport) Direct(n int) bool { return n <= t.direct }

// StripeMin is the least of a message that one connection carries before
// another joins in: a message of n bytes goes over Stripes(n, channels)
// connections, the first ones. Small messages thus pay for one frame on
// one connection, however many there are, and large ones use them all.
// Below 512 KiB a second connection costs more (another frame, another
// wake-up) than it gains: a message of 512 KiB went faster whole
// than as two stripes, and 2 MiB faster as four 512 KiB stripes than as
// two of 1 MiB (docs/PERFORMANCE.md).
const StripeMin = 512 << 10

// Stripes is how many connections carry a message of n bytes.
func Stripes(n, channels int) int {
	return max(1, min(channels, (n+StripeMin-1)/StripeMin))
}

// Stripe is connection ch's part of n bytes striped over k connections.
// The first frame's header names k, so a receiver reads exactly the frames
// that were sent, even when the two ends disagree about n: the streams stay
// in step.
func Stripe(n, k, ch int) (lo, hi int) {
	per := (n + k - 1) / k
	lo = min(ch*per, n)
	return lo, min(lo+per, n)
}

// CopyRides says whether an out-of-place block of n bytes should have
// its own copy ride with a send (SendCopy) rather than be copied apart.
func (t *Transport) CopyRides(n int) bool {
	return t.cfg.SendCopyMin > 0 && n >= t.cfg.SendCopyMin
}

// CopyChunk is how much of a SendCopy's buffer is written to a socket
// before the writer copies it: small enough that what the kernel has just
// read is still in the core's cache (and that Go's copy keeps its cached
// stores, which it gives up from 1 MiB); 256 KiB chunks carried more
// than 1 MiB ones (docs/PERFORMANCE.md).
const CopyChunk = 256 << 10

// Send starts sending buf to peer p; WaitSend collects the result.
func (t *Transport) Send(p int, epoch, hash uint64, buf []byte, deadline time.Time) {
	t.SendCopy(p, epoch, hash, buf, nil, deadline)
}

// SendCopy is Send that also copies buf into also (of the same length,
// not overlapping buf, or nil for none): each connection's writer copies
// its stripe CopyChunk by CopyChunk, each piece right after the socket
// took it. An out-of-place all-gather puts the rank's own block in place
// this way: the copy then reads from cache what a separate copy would
// read from memory again.
func (t *Transport) SendCopy(p int, epoch, hash uint64, buf, also []byte, deadline time.Time) {
	pr := t.peers[p]
	k := Stripes(len(buf), len(pr.conns))
	pr.sendDirect, pr.sendN = t.Direct(len(buf)), k
	for ch := range k {
		lo, hi := Stripe(len(buf), k, ch)
		j := job{epoch: epoch, hash: hash, buf: buf[lo:hi], deadline: deadline, total: len(buf), stripes: k}
		if also != nil {
			j.also = also[lo:hi]
		}
		if !pr.sendDirect {
			pr.conns[ch].sendq <- j
		} else if err := pr.lose(pr.conns[ch].sendNow(j)); err != nil && pr.sendErr == nil {
			pr.sendErr = err
		}
	}
}

// Recv starts receiving len(buf) bytes from peer p into buf; WaitRecv
// collects the result.
func (t *Transport) Recv(p int, epoch, hash uint64, buf []byte, deadline time.Time) {
	pr := t.peers[p]
	pr.recvDirect = t.Direct(len(buf))
	j := job{epoch: epoch, hash: hash, buf: buf, deadline: deadline, lead: true}
	if pr.recvDirect {
		pr.recvJob = j
		return
	}
	pr.conns[0].recvq <- j
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
	return wait(pr.sendDone, pr.sendN)
}

func (t *Transport) WaitRecv(p int) error {
	pr := t.peers[p]
	if !pr.recvDirect {
		return wait(pr.recvDone, len(pr.conns))
	}
	// In this goroutine: the first frame, then any others the sender
	// striped a larger message over (to drain them).
	// The first frame is awaited by polling before parking (see Reader):
	// a small message's wait is a round trip, shorter than a wake-up.
	lead := pr.conns[0]
	lead.rd.Poll = true
	h, err := lead.header(pr.recvJob, lead.firstLen(pr.recvJob))
	if err != nil {
		lead.rd.Poll = false
		return pr.lose(err)
	}
	err = lead.first(pr.recvJob, h, lead.plan(pr.recvJob, h))
	lead.rd.Poll = false
	for ch := 1; ch < int(h.Stripes); ch++ {
		if e := pr.conns[ch].receive(pr.rest[ch]); e != nil && (err == nil || errors.Is(err, ErrMismatch) && !errors.Is(e, ErrMismatch)) {
			err = e
		}
	}
	return pr.lose(err)
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
		c.p.sendDone <- c.p.lose(c.send(j))
	}
}

// send writes one frame: the header and the payload (its first CopyChunk
// when the job copies it too) in one vectored write, then the rest of the
// payload a chunk at a time, each copied to j.also after its write.
func (c *conn) send(j job) error {
	h := Header{Kind: KindData, Sender: c.me, Epoch: j.epoch, Hash: j.hash, Count: uint64(len(j.buf)),
		Total: uint64(j.total), Stripes: uint32(j.stripes)}
	h.Put(c.whdr[:])
	c.armWrite(j.deadline)
	n := len(j.buf)
	if j.also != nil {
		n = min(n, CopyChunk)
	}
	c.vec[0], c.vec[1] = c.whdr[:], j.buf[:n]
	c.bufs = c.vec[:]
	raceio.Release()
	if _, err := c.bufs.WriteTo(c.c); err != nil || j.also == nil {
		return c.classify(err, "sending")
	}
	copy(j.also[:n], j.buf[:n])
	for lo := n; lo < len(j.buf); lo += CopyChunk {
		hi := min(lo+CopyChunk, len(j.buf))
		raceio.Release()
		if _, err := c.c.Write(j.buf[lo:hi]); err != nil {
			return c.classify(err, "sending")
		}
		copy(j.also[lo:hi], j.buf[lo:hi])
	}
	return nil
}

// armWrite sets the socket's write deadline to d (see sendNow).
func (c *conn) armWrite(d time.Time) {
	if !c.wArmed || !c.wDeadline.Equal(d) {
		c.c.SetWriteDeadline(d)
	}
	c.wDeadline, c.wArmed = d, true
}

// sendNow is send in the caller's goroutine (Direct): the header and the
// payload in one vectored write through the connection's RawConn, with no
// write deadline on the socket unless the write must wait for room, when
// it sets one and parks. A pending deadline is a runtime timer, which keeps
// an idle processor of the process waiting in the netpoller, where every
// arriving segment wakes it (see Reader); a message that fits the send
// buffer never waits. A job that copies its payload too goes through send.
func (c *conn) sendNow(j job) error {
	if j.also != nil || c.writeFn == nil {
		return c.send(j)
	}
	h := Header{Kind: KindData, Sender: c.me, Epoch: j.epoch, Hash: j.hash, Count: uint64(len(j.buf)),
		Total: uint64(j.total), Stripes: uint32(j.stripes)}
	h.Put(c.whdr[:])
	if c.wArmed {
		c.c.SetWriteDeadline(time.Time{})
		c.wArmed = false
	}
	c.wDeadline = j.deadline
	c.iov[0].Base = &c.whdr[0]
	c.iov[0].SetLen(HeaderSize)
	c.iov[1].Base, c.iovAt = nil, 0
	c.iov[1].SetLen(0)
	if len(j.buf) > 0 {
		c.iov[1].Base = &j.buf[0]
		c.iov[1].SetLen(len(j.buf))
	}
	c.wErr = nil
	raceio.Release()
	err := c.wrc.Write(c.writeFn)
	c.iov[0].Base, c.iov[1].Base = nil, nil // keep no buffer alive
	if c.wArmed {
		c.c.SetWriteDeadline(time.Time{})
		c.wArmed = false
	}
	if err == nil {
		err = c.wErr
	}
	return c.classify(err, "sending")
}

// writev is sendNow's RawConn callback: it writes what is left of c.iov,
// and where the socket has no room sets the write deadline and returns
// false to park until it has. The socket is non-blocking, so writev(2)
// returns at once and is made without the runtime's system-call
// bookkeeping: entering a system call wakes the runtime's monitor thread
// whenever it sleeps (as it does while the process idles between calls),
// a futex wake-up and a thread run on some core per message.
func (c *conn) writev(fd uintptr) bool {
	for c.iovAt < len(c.iov) {
		if c.iov[c.iovAt].Len == 0 {
			c.iovAt++
			continue
		}
		n, _, e := unix.RawSyscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&c.iov[c.iovAt])), uintptr(len(c.iov)-c.iovAt))
		switch e {
		case 0:
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			c.armWrite(c.wDeadline)
			return false
		default:
			c.wErr = e
			return true
		}
		for left := uint64(n); left > 0 && c.iovAt < len(c.iov); {
			v := &c.iov[c.iovAt]
			k := min(left, v.Len)
			left -= k
			if k == v.Len { // never a pointer past the buffer's end
				v.Base, v.Len = nil, 0
				c.iovAt++
				continue
			}
			v.Base = (*byte)(unsafe.Add(unsafe.Pointer(v.Base), k))
			v.Len -= k
		}
	}
	return true
}

// reader serves receives on this connection: on the first connection it
// reads the first frame of each message and hands the others' frames to
// their connections' readers; each posts one result per connection.
func (c *conn) reader() {
	for {
		select {
		case j := <-c.recvq:
			if !j.lead {
				c.p.recvDone <- c.p.lose(c.receive(j))
				continue
			}
			h, err := c.header(j, c.firstLen(j))
			if err != nil {
				c.p.lose(err)
				for range c.p.conns {
					c.p.recvDone <- err
					err = nil
				}
				continue
			}
			// The other connections' readers start before this one
			// reads its own stripe, so that all of them read at once.
			match := c.plan(j, h)
			for ch := 1; ch < len(c.p.conns); ch++ {
				if ch >= int(h.Stripes) {
					c.p.recvDone <- nil // the sender put no frame there
					continue
				}
				select {
				case c.p.conns[ch].recvq <- c.p.rest[ch]:
				case <-c.done:
					return
				}
			}
			c.p.recvDone <- c.p.lose(c.first(j, h, match))
		case <-c.done:
			return
		}
	}
}

// firstLen is the length of the first frame's payload of the message j
// expects (its stripe 0), which header reads with the header where small.
func (c *conn) firstLen(j job) int {
	_, hi := Stripe(len(j.buf), Stripes(len(j.buf), len(c.p.conns)), 0)
	return hi
}

// header reads and checks the header of the frame of the message j
// expects on this connection, and up to more bytes after it (the
// payload, where small: Reader.ReadAhead).
func (c *conn) header(j job, more int) (Header, error) {
	c.rd.SetDeadline(j.deadline)
	if err := c.rd.ReadAhead(c.rhdr[:], more); err != nil {
		return Header{}, c.classify(err, "receiving a header")
	}
	h, err := Decode(c.rhdr[:])
	if err != nil {
		return h, fmt.Errorf("%w: from rank %d: %v", fault.ErrPeerLost, c.p.rank, err)
	}
	if h.Kind != KindData || int(h.Sender) != c.p.rank || h.Epoch != j.epoch {
		return h, fmt.Errorf("%w: rank %d's stream is out of step (call %d from rank %d, want call %d)", fault.ErrPeerLost, c.p.rank, h.Epoch, h.Sender, j.epoch)
	}
	if int(h.Stripes) > len(c.p.conns) {
		return h, fmt.Errorf("%w: rank %d striped a message over %d connections; there are %d", fault.ErrPeerLost, c.p.rank, h.Stripes, len(c.p.conns))
	}
	return h, nil
}

// plan sets, from the first frame's header h, the jobs for the message's
// other frames (c.p.rest[ch] for connection ch < h.Stripes): their stripes
// of j.buf when the sender's message is the one j expects, or drains when
// it is not; it reports which.
func (c *conn) plan(j job, h Header) (match bool) {
	rest := c.p.rest
	k := int(h.Stripes)
	match = h.Hash == j.hash && h.Total == uint64(len(j.buf)) && k == Stripes(len(j.buf), len(c.p.conns))
	for ch := 1; ch < k; ch++ {
		rest[ch] = job{epoch: j.epoch, hash: j.hash, deadline: j.deadline, drain: !match}
		if match {
			lo, hi := Stripe(len(j.buf), k, ch)
			rest[ch].buf = j.buf[lo:hi]
		}
	}
	return match
}

// first receives the payload of the first frame, whose header h has been
// read: its stripe of j.buf, or, when the message is not the one j
// expects, to nowhere, returning the mismatch.
func (c *conn) first(j job, h Header, match bool) error {
	if !match {
		if err := c.discard(h.Count); err != nil {
			return err
		}
		if h.Total != uint64(len(j.buf)) {
			return fmt.Errorf("%w: rank %d sent %d bytes, this rank expected %d", ErrCallsDiffer, c.p.rank, h.Total, len(j.buf))
		}
		return fmt.Errorf("%w: rank %d's call differs from this rank's (the operation, or a size on some rank)", ErrCallsDiffer, c.p.rank)
	}
	_, hi := Stripe(len(j.buf), int(h.Stripes), 0)
	if h.Count != uint64(hi) {
		return fmt.Errorf("%w: rank %d's stream is out of step (a first stripe of %d bytes, want %d)", fault.ErrPeerLost, c.p.rank, h.Count, hi)
	}
	if err := c.rd.ReadFull(j.buf[:hi]); err != nil {
		return c.classify(err, "receiving a block")
	}
	return nil
}

// receive reads one frame after the first of a message: into j.buf, or
// to nowhere when j.drain says the message is not the expected one.
func (c *conn) receive(j job) error {
	more := len(j.buf)
	if j.drain {
		more = 0
	}
	h, err := c.header(j, more)
	if err != nil {
		return err
	}
	if j.drain {
		return c.discard(h.Count)
	}
	if h.Count != uint64(len(j.buf)) {
		return fmt.Errorf("%w: rank %d's stream is out of step (a stripe of %d bytes, want %d)", fault.ErrPeerLost, c.p.rank, h.Count, len(j.buf))
	}
	if err := c.rd.ReadFull(j.buf); err != nil {
		return c.classify(err, "receiving a block")
	}
	return nil
}

// discard reads n bytes of payload to nowhere, so that the stream stays in
// step after a mismatch.
func (c *conn) discard(n uint64) error {
	if err := c.rd.Discard(n); err != nil {
		return c.classify(err, "draining a mismatched block")
	}
	return nil
}

// classify maps a socket error to the project's errors.
func (c *conn) classify(err error, what string) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("%w: %s, peer rank %d", fault.ErrTimeout, what, c.p.rank) // what says the direction: "sending", "receiving a header"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, net.ErrClosed):
		return fmt.Errorf("%w: connection to rank %d closed while %s", fault.ErrPeerLost, c.p.rank, what)
	}
	return fmt.Errorf("%w: %s, rank %d: %v", fault.ErrPeerLost, what, c.p.rank, err)
}
