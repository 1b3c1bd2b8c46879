package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/inter"
	"github.com/slimego/slimego/internal/auth"
	"github.com/slimego/slimego/internal/interleave"
)

// TCPResult is one raw-TCP figure between ranks 0 and 1.
type TCPResult struct {
	S        int64   // bytes per transfer (8 for latency)
	Channels int     // connections the transfer is striped over
	Duplex   bool    // both ranks sent S bytes at once; GBps is per direction
	Median   float64 // µs: one-way latency, or the time of one transfer
	GBps     float64 // 0 for latency
	Lowat    int     // the receive low-water mark bound (inter.Reader), 0 for plain reads
	// Latency marks the 8-byte ping-pong's row (Median: half a round
	// trip); every other row is a transfer, whose GBps is 0 at size 0 too.
	Latency bool
}

// TCP measures the link between the two ranks of c with plain sockets set
// up as slimego's transport sets them up (TCP_NODELAY, 4 MiB send buffers,
// receive buffers autotuned): the
// one-way latency of 8 bytes (half a round trip), and the bandwidth of
// transfers of each size over channels connections: one-directional (rank
// 1 to rank 0, striped evenly), or with duplex both ranks sending to each
// other at once, striped as the transport stripes a message, as an
// all-gather between two nodes does. Both ranks return the same
// figures.
//
// Receives read whole stripes with an inter.Reader bounded by lowat (0:
// plain reads, woken per segment), as the transport does.
func TCP(ctx context.Context, c *collective.Communicator, masterAddr string, sizes []int64, channels int, duplex bool, lowat int, minTime time.Duration) ([]TCPResult, error) {
	l, err := openLink(ctx, c, masterAddr, channels, lowat)
	if err != nil {
		return nil, err
	}
	defer l.close()
	conns, readers := l.conns, l.readers
	// agree returns the larger of the two ranks' x, so that both ranks
	// choose the same iteration counts.
	agree := func(x float64) (float64, error) {
		both := make([]float64, 2)
		err := collective.AllGatherOf(ctx, c, both, []float64{x})
		return max(both[0], both[1]), err
	}
	var res []TCPResult

	// Latency: 8-byte ping-pong on the first connection.
	var b [8]byte
	pingPong := func() error {
		var err error
		if c.Rank() == 1 {
			if _, err = conns[0].Write(b[:]); err == nil {
				_, err = io.ReadFull(conns[0], b[:])
			}
		} else if _, err = io.ReadFull(conns[0], b[:]); err == nil {
			_, err = conns[0].Write(b[:])
		}
		return err
	}
	l.arm() // each loop of ping-pongs takes about minTime, far below the timeout
	t0 := time.Now()
	for range 100 {
		if err := pingPong(); err != nil {
			return nil, l.fail("ping-pong", err)
		}
	}
	per, err := agree(time.Since(t0).Seconds() / 100)
	if err != nil {
		return nil, err
	}
	iters := min(max(1000, int(minTime.Seconds()/per)), MaxIters)
	times := make([]float64, iters)
	l.arm()
	for i := range times {
		t0 := time.Now()
		if err := pingPong(); err != nil {
			return nil, l.fail("ping-pong", err)
		}
		times[i] = float64(time.Since(t0).Nanoseconds()) / 2e3
	}
	lat, err := agree(interleave.Median(times))
	if err != nil {
		return nil, err
	}
	res = append(res, TCPResult{S: 8, Channels: 1, Median: lat, Latency: true})

	// Bandwidth: rank 1 sends n bytes, rank 0 acknowledges with one.
	for _, n := range sizes {
		buf, out := make([]byte, n), make([]byte, n)
		once := func() (float64, error) {
			if err := c.Barrier(ctx); err != nil {
				return 0, err
			}
			if duplex {
				t0 := time.Now()
				err := l.duplex(out, buf)
				return float64(time.Since(t0).Nanoseconds()) / 1e3, err
			}
			l.arm()
			t0 := time.Now()
			errs := make(chan error, channels)
			for ch, conn := range conns {
				lo, hi := int64(ch)*n/int64(channels), int64(ch+1)*n/int64(channels)
				rd := &readers[ch]
				go func() {
					var ack [1]byte
					var err error
					if c.Rank() == 1 {
						if _, err = conn.Write(buf[lo:hi]); err == nil {
							_, err = io.ReadFull(conn, ack[:])
						}
					} else if err = rd.ReadFull(buf[lo:hi]); err == nil {
						_, err = conn.Write(ack[:])
					}
					errs <- err
				}()
			}
			var first error
			for range channels {
				if err := <-errs; err != nil && first == nil {
					first = err
				}
			}
			return float64(time.Since(t0).Nanoseconds()) / 1e3, l.fail("one-way transfer", first)
		}
		t, err := once() // warm-up, and the estimate for the count
		if err != nil {
			return nil, err
		}
		if t, err = agree(t); err != nil {
			return nil, err
		}
		iters := min(max(5, int(float64(minTime.Microseconds())/t)), 1000)
		ts := make([]float64, iters)
		for i := range ts {
			if ts[i], err = once(); err != nil {
				return nil, err
			}
		}
		m, err := agree(interleave.Median(ts))
		if err != nil {
			return nil, err
		}
		res = append(res, TCPResult{S: n, Channels: channels, Duplex: duplex, Median: m, GBps: float64(n) / (m * 1e-6) / 1e9, Lowat: lowat})
	}
	return res, nil
}

// link is a set of plain TCP connections between the two ranks of a
// communicator, set up as the transport sets up its own (TCP_NODELAY,
// DefaultSockBuf send buffers, reads bounded by a low-water mark).
type link struct {
	conns   []*net.TCPConn
	readers []inter.Reader
	errs    chan error
	timeout time.Duration // bound on each transfer (the communicator's)
	rank    int
}

// fail names the rank, its peer and the operation in err (nil stays nil).
func (l *link) fail(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("bench: %s, rank %d with rank %d: %w", op, l.rank, 1-l.rank, err)
}

// arm bounds every read and write on the connections until timeout from
// now, so that a stalled or vanished peer is an error, not a hang.
func (l *link) arm() {
	deadline := time.Now().Add(l.timeout)
	for _, c := range l.conns {
		c.SetDeadline(deadline)
	}
	// An inter.Reader keeps a deadline of its own, which its reads put on
	// the socket (the zero time, never, unless set): the socket's alone
	// would not bound them.
	for i := range l.readers {
		l.readers[i].SetDeadline(deadline)
	}
}

// testHookLinkDial, when set, is called by rank 1 with rank 0's address
// before it dials (tests: a stranger connects first).
var testHookLinkDial func(addr string)

const (
	// linkPurpose is the purpose the link's connections prove with the
	// job's key (internal/auth): neither the store's nor the transport's.
	linkPurpose = "bench"
	// linkMagic opens the hello that follows the handshake, which names
	// the channel a connection is and how many the link has.
	linkMagic     = "SLMGBNCH"
	linkHelloSize = len(linkMagic) + 8
	// linkHandshake bounds one connection's handshake and hello (the
	// transport's default, inter.DefaultHandshakeTimeout).
	linkHandshake = inter.DefaultHandshakeTimeout
	// linkMaxPending bounds the connections whose handshake is under way;
	// beyond it the oldest is closed (rank 1 dials one at a time, and
	// again after a failed handshake).
	linkMaxPending = 32
	// linkRedial is how long rank 1 waits before it dials again after a
	// handshake that failed.
	linkRedial = 50 * time.Millisecond
)

// openLink connects rank 0 and rank 1 of c with channels connections;
// rank 0 listens on the interface that reaches masterAddr. Every
// connection first proves, both ways, that its two ends hold the job's
// key (internal/auth, with the key the collective's own connections
// prove, purpose "bench"), then rank 1 names the connection's channel in
// a hello; rank 0 closes a connection that fails either, within
// linkHandshake, and it does not count: whoever reaches the listener
// first, only rank 1's connections make the link. Both ranks give up at
// c's timeout (or ctx's deadline).
func openLink(ctx context.Context, c *collective.Communicator, masterAddr string, channels int, lowat int) (*link, error) {
	if c.Size() != 2 {
		return nil, fmt.Errorf("bench: the link is measured between two ranks (one per node); this job has %d", c.Size())
	}
	if channels <= 0 || channels > 1<<16 {
		return nil, fmt.Errorf("bench: the link has %d channels, want 1 to %d", channels, 1<<16)
	}
	// Rank 0 listens; its address reaches rank 1 through an all-gather.
	const addrLen = 64
	mine := make([]byte, addrLen)
	var ln *net.TCPListener
	if c.Rank() == 0 {
		ip, err := inter.LocalIP("", masterAddr)
		if err != nil {
			return nil, err
		}
		l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			return nil, err
		}
		ln = l.(*net.TCPListener)
		defer ln.Close()
		copy(mine, ln.Addr().String())
	}
	all := make([]byte, 2*addrLen)
	if err := c.AllGather(ctx, all, mine); err != nil {
		return nil, err
	}
	addr := strings.TrimRight(string(all[:addrLen]), "\x00")
	if testHookLinkDial != nil && c.Rank() == 1 {
		testHookLinkDial(addr)
	}
	l := &link{errs: make(chan error, 2*channels), timeout: c.Timeout(), rank: c.Rank()}
	deadline := time.Now().Add(c.Timeout())
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	key := auth.NewKey(c.Options().JobSecret, c.Options().JobID)
	var conns []*net.TCPConn
	var err error
	if c.Rank() == 0 {
		conns, err = acceptLink(ctx, ln, key, channels, deadline)
	} else {
		conns, err = dialLink(addr, key, channels, deadline)
	}
	if err != nil {
		return nil, l.fail("opening the plain TCP link", err)
	}
	for _, tc := range conns {
		tc.SetDeadline(time.Time{})
		tc.SetNoDelay(true)
		tc.SetWriteBuffer(inter.DefaultSockBuf) // receive buffers autotuned, as the transport's (inter.Config.SockBuf)
		l.conns = append(l.conns, tc)
		l.readers = append(l.readers, inter.NewReader(tc, lowat))
	}
	return l, nil
}

// handshakeBy is when one connection's handshake and hello must be done:
// linkHandshake from now, or at deadline if that comes first.
func handshakeBy(deadline time.Time) time.Time {
	if d := time.Now().Add(linkHandshake); d.Before(deadline) {
		return d
	}
	return deadline
}

// dialLink is rank 1's side of openLink: channels connections to addr, one
// at a time, each with the handshake and the hello naming its channel.
func dialLink(addr string, key auth.Key, channels int, deadline time.Time) ([]*net.TCPConn, error) {
	var conns []*net.TCPConn
	fail := func(ch int, op string, err error) ([]*net.TCPConn, error) {
		for _, c := range conns {
			c.Close()
		}
		return nil, fmt.Errorf("channel %d of %d: %s %s: %w", ch, channels, op, addr, err)
	}
	for ch := range channels {
		var tc *net.TCPConn
		for {
			conn, err := net.DialTimeout("tcp", addr, time.Until(deadline))
			if err != nil {
				return fail(ch, "dial", err)
			}
			tc = conn.(*net.TCPConn)
			err = auth.Connect(tc, key, linkPurpose, handshakeBy(deadline))
			if err == nil {
				break
			}
			tc.Close()
			// Rank 0 may have let this connection go for strangers'
			// (its handshakes under way are bounded): dial again, until
			// the deadline.
			if time.Until(deadline) < linkRedial {
				return fail(ch, "handshake with", err)
			}
			time.Sleep(linkRedial)
		}
		by := handshakeBy(deadline)
		hello := make([]byte, 0, linkHelloSize)
		hello = append(hello, linkMagic...)
		hello = binary.LittleEndian.AppendUint32(hello, uint32(ch))
		hello = binary.LittleEndian.AppendUint32(hello, uint32(channels))
		tc.SetDeadline(by)
		if _, err := tc.Write(hello); err != nil {
			tc.Close()
			return fail(ch, "hello to", err)
		}
		conns = append(conns, tc)
	}
	return conns, nil
}

// acceptLink is rank 0's side of openLink: it accepts on ln until rank 1's
// channels connections have each passed the handshake and named a channel
// of their own, by deadline. Each connection's handshake runs on a
// goroutine of its own, so that one that stalls holds up no other; a
// connection that fails is closed. Every goroutine it started has ended
// when it returns.
func acceptLink(ctx context.Context, ln *net.TCPListener, key auth.Key, channels int, deadline time.Time) ([]*net.TCPConn, error) {
	type greeted struct {
		c   *net.TCPConn
		ch  int
		err error
	}
	results := make(chan greeted)
	stop := make(chan struct{})
	var mu sync.Mutex
	pending := map[*net.TCPConn]bool{}
	var order []*net.TCPConn // pending's, oldest first (and some no longer pending)
	ended := false           // acceptLink is returning: no new handshake
	var wg sync.WaitGroup
	ln.SetDeadline(deadline)
	wg.Add(1)
	go func() { // the accept loop: ends when ln is closed or at deadline
		defer wg.Done()
		for {
			conn, err := ln.AcceptTCP()
			if err != nil {
				return
			}
			mu.Lock()
			if ended {
				// accepted as acceptLink returned: closed now, not
				// left to a handshake nobody waits for
				mu.Unlock()
				conn.Close()
				return
			}
			if len(pending) >= linkMaxPending {
				// The oldest handshake under way gives way, as the
				// transport's do: connections that say nothing would
				// otherwise keep rank 1 out until the deadline.
				for len(order) > 0 && !pending[order[0]] {
					order = order[1:]
				}
				if len(order) > 0 {
					delete(pending, order[0])
					order[0].Close()
					order = order[1:]
				}
			}
			pending[conn] = true
			order = append(order, conn)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				ch, err := greetLink(conn, key, channels, handshakeBy(deadline))
				select {
				case results <- greeted{conn, ch, err}:
				case <-stop:
					conn.Close() // a connection nobody took
				}
			}()
		}
	}()
	conns := make([]*net.TCPConn, channels)
	var got, refused int
	var last error
	defer func() {
		close(stop)
		ln.Close()
		mu.Lock()
		ended = true
		for c := range pending { // unblocks the handshakes under way
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}()
	t0 := time.Now()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for got < channels {
		select {
		case r := <-results:
			mu.Lock()
			delete(pending, r.c)
			mu.Unlock()
			if r.err == nil && conns[r.ch] != nil {
				r.err = fmt.Errorf("%s named channel %d, which another connection has", r.c.RemoteAddr(), r.ch)
			}
			if r.err != nil {
				r.c.Close()
				refused++
				last = r.err
				continue
			}
			conns[r.ch] = r.c
			got++
		case <-timer.C:
			for _, c := range conns {
				if c != nil {
					c.Close()
				}
			}
			msg := fmt.Sprintf("accept: %d of %d connections after %v", got, channels, time.Since(t0).Round(time.Millisecond))
			if refused > 0 {
				msg += fmt.Sprintf("; %d others were refused, the last: %v", refused, last)
			}
			return nil, fmt.Errorf("%s: %w", msg, os.ErrDeadlineExceeded)
		case <-ctx.Done():
			for _, c := range conns {
				if c != nil {
					c.Close()
				}
			}
			return nil, fmt.Errorf("accept: %d of %d connections: %w", got, channels, ctx.Err())
		}
	}
	return conns, nil
}

// greetLink runs rank 0's side of one connection by deadline: the
// handshake, then the hello, which must name a channel below channels of a
// link of channels connections.
func greetLink(c *net.TCPConn, key auth.Key, channels int, deadline time.Time) (int, error) {
	if err := auth.Accept(c, key, linkPurpose, deadline); err != nil {
		return 0, fmt.Errorf("%s: %w", c.RemoteAddr(), err)
	}
	c.SetDeadline(deadline)
	var b [linkHelloSize]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return 0, fmt.Errorf("%s passed the handshake, then sent no hello: %w", c.RemoteAddr(), err)
	}
	ch := binary.LittleEndian.Uint32(b[len(linkMagic):])
	n := binary.LittleEndian.Uint32(b[len(linkMagic)+4:])
	if string(b[:len(linkMagic)]) != linkMagic || n != uint32(channels) || ch >= n {
		return 0, fmt.Errorf("%s passed the handshake, then sent a bad hello (channel %d of %d, want one of %d)", c.RemoteAddr(), ch, n, channels)
	}
	return int(ch), nil
}

// duplex sends out and receives len(in) bytes at once, each striped over
// the connections as the transport stripes a message (inter.Stripes), as an
// all-gather between two nodes does. Like the transport, it bounds each
// transfer with a deadline.
func (l *link) duplex(out, in []byte) error {
	l.arm()
	ko, ki := inter.Stripes(len(out), len(l.conns)), inter.Stripes(len(in), len(l.conns))
	for i, conn := range l.conns[:max(ko, ki)] {
		olo, ohi := inter.Stripe(len(out), ko, i)
		ilo, ihi := inter.Stripe(len(in), ki, i)
		rd := &l.readers[i]
		go func() { _, err := conn.Write(out[olo:ohi]); l.errs <- err }()
		go func() { l.errs <- rd.ReadFull(in[ilo:ihi]) }()
	}
	var first error
	for range 2 * max(ko, ki) {
		if err := <-l.errs; err != nil && first == nil {
			first = err
		}
	}
	return l.fail("duplex transfer on plain TCP", first)
}

func (l *link) close() {
	for _, c := range l.conns {
		c.Close()
	}
}
