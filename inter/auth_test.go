package inter

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/auth"
	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/rendezvous"
)

// handshakeProof is what a connector sends in the handshake (internal/auth:
// magic, version, nonce, HMAC).
const handshakeProof = 8 + 1 + 32 + 32

// testStore starts a store of this process and returns a client of it
// for each of n parties.
func testStore(t *testing.T, n int) []*rendezvous.Client {
	t.Helper()
	srv, err := rendezvous.Listen("127.0.0.1:0", rendezvous.ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs := make([]*rendezvous.Client, n)
	for i := range cs {
		if cs[i], err = rendezvous.Dial(ctx, srv.Addr().String(), rendezvous.Auth{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cs[i].Close() })
	}
	return cs
}

// rankConfig is rank r's transport of a two-rank job (rank 0 dials,
// rank 1 accepts) with the given key.
func rankConfig(store *rendezvous.Client, r int, key auth.Key, timeout time.Duration) Config {
	return Config{Store: store, Key: "t", Rank: r, Peers: []int{1 - r}, Channels: 4, MasterAddr: "127.0.0.1",
		Timeout: timeout, Auth: key, HandshakeTimeout: time.Second}
}

type started struct {
	tr   *Transport
	err  error
	took time.Duration
}

// start runs New(cfg) in a goroutine; its result arrives on the channel,
// and a transport it made is closed at the test's end.
func start(t *testing.T, cfg Config) <-chan started {
	out := make(chan started, 1)
	go func() {
		t0 := time.Now()
		tr, err := New(context.Background(), cfg)
		out <- started{tr, err, time.Since(t0)}
	}()
	return out
}

// await is start's result, or a failure if New has not returned within
// bound: New must never outlive its deadline.
func await(t *testing.T, c <-chan started, bound time.Duration) started {
	t.Helper()
	select {
	case s := <-c:
		if s.tr != nil {
			t.Cleanup(func() { s.tr.Close() })
		}
		return s
	case <-time.After(bound):
		t.Fatalf("New has not returned after %v", bound)
		return started{}
	}
}

// checkConnectErr fails unless err is New's error about peer with the
// sentinel want.
func checkConnectErr(t *testing.T, who string, err error, peer int, want error) {
	t.Helper()
	var oe *fault.OpError
	switch {
	case err == nil:
		t.Fatalf("%s: New succeeded, want an error (%v)", who, want)
	case !errors.Is(err, want):
		t.Fatalf("%s: %v, want %v", who, err, want)
	case !errors.As(err, &oe) || oe.Op != "connect" || oe.Peer != peer:
		t.Fatalf("%s: %v: want the op \"connect\" naming peer %d", who, err, peer)
	}
	t.Logf("%s: %v", who, err)
}

// noSetupGoroutines fails if a goroutine of New's accepting is left. New
// has waited for each to call Done, so within a moment none may be left
// (one may still be returning after its Done).
func noSetupGoroutines(t *testing.T) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(5 * time.Second); ; {
		stacks := string(buf[:runtime.Stack(buf, true)])
		left := ""
		for _, f := range []string{"inter.(*Transport).acceptAll", "inter.(*Transport).greet"} {
			if strings.Contains(stacks, f) {
				left = f
			}
		}
		if left == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a goroutine of %s outlived New:\n%s", left, stacks)
		}
		runtime.Gosched()
	}
}

// closedWithin fails unless the other end closes c within bound.
func closedWithin(t *testing.T, c net.Conn, bound time.Duration) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(bound))
	_, err := io.Copy(io.Discard, c)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the transport left a foreign connection from %s open for %v", c.LocalAddr(), bound)
	}
}

// TestTransportConnectAuthenticated: two transports with the same key
// connect, and random data crosses both ways byte for byte.
func TestTransportConnectAuthenticated(t *testing.T) {
	st := testStore(t, 2)
	var rs [2]<-chan started
	for r := range 2 {
		rs[r] = start(t, rankConfig(st[r], r, testKey, 10*time.Second))
	}
	var ts [2]*Transport
	for r := range 2 {
		s := await(t, rs[r], 20*time.Second)
		if s.err != nil {
			t.Fatalf("rank %d: %v", r, s.err)
		}
		ts[r] = s.tr
	}
	noSetupGoroutines(t)
	for it, n := range []int{1, 4096, 3<<20 + 5} {
		exchange(t, ts, n, it)
	}
}

// TestTransportWrongKey: transports whose keys differ (another secret, or
// another job id) never connect. The dialer, which hears the acceptor
// refuse, fails at once with ErrDenied naming its peer; the acceptor never
// gets a valid connection and times out naming the rank that did not
// connect, and saying that a connection was refused. No goroutine of
// either outlives New.
func TestTransportWrongKey(t *testing.T) {
	for _, tc := range []struct {
		name string
		key  auth.Key
	}{
		{"another secret", auth.NewKey([]byte("another secret"), testKey.Job())},
		{"another job", auth.NewKey([]byte("the job's secret"), "job-2")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const timeout = 3 * time.Second
			st := testStore(t, 2)
			dialer := start(t, rankConfig(st[0], 0, testKey, timeout))
			acceptor := start(t, rankConfig(st[1], 1, tc.key, timeout))
			d := await(t, dialer, timeout+5*time.Second)
			checkConnectErr(t, "rank 0", d.err, 1, ErrDenied)
			if d.took >= timeout {
				t.Errorf("rank 0 failed after %v, at the deadline: a refusal must be final", d.took)
			}
			a := await(t, acceptor, timeout+5*time.Second)
			checkConnectErr(t, "rank 1", a.err, 0, fault.ErrTimeout)
			if !strings.Contains(a.err.Error(), "refused") {
				t.Errorf("rank 1: %v: does not say that a connection was refused", a.err)
			}
			noSetupGoroutines(t)
		})
	}
}

// TestTransportForeignConnections: idle connections and connections that
// send garbage, opened to the acceptor's port while it connects, do not
// disturb it. With the real peer dialing while they are pending, or after
// they were dropped, or with more of them than MaxPendingHandshakes (the
// acceptor closes the excess at once, and the peer's dialer retries), New
// succeeds on both ranks well within the timeout, the connection carries
// data, and every foreign connection is closed by the acceptor within its
// handshake timeout.
func TestTransportForeignConnections(t *testing.T) {
	for _, tc := range []struct {
		name          string
		idle, garbage int
		dropFirst     bool // the peer dials once the foreign ones were dropped
	}{
		{"pending", 20, 5, false},
		{"dropped first", 20, 5, true},
		{"beyond the bound", MaxPendingHandshakes + 36, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const timeout = 10 * time.Second
			st := testStore(t, 3) // rank 0, rank 1, the foreign party
			cfg1 := rankConfig(st[1], 1, testKey, timeout)
			acceptor := start(t, cfg1)
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			addr, err := st[2].Get(ctx, "t/addr/1")
			if err != nil {
				t.Fatal(err)
			}
			var foreign []net.Conn
			for i := range tc.idle + tc.garbage {
				c, err := net.DialTimeout("tcp", string(addr), 5*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				if i >= tc.idle {
					junk := make([]byte, 200)
					rand.Read(junk)
					if _, err := c.Write(junk); err != nil {
						t.Fatal(err)
					}
				}
				foreign = append(foreign, c)
			}
			bound := cfg1.HandshakeTimeout + 5*time.Second
			if tc.dropFirst {
				for _, c := range foreign {
					closedWithin(t, c, bound)
				}
			}
			dialer := start(t, rankConfig(st[0], 0, testKey, timeout))
			var ts [2]*Transport
			for r, c := range []<-chan started{dialer, acceptor} {
				s := await(t, c, timeout+5*time.Second)
				if s.err != nil {
					t.Fatalf("rank %d: %v", r, s.err)
				}
				if s.took > timeout/2 {
					t.Errorf("rank %d took %v to connect, near its timeout %v", r, s.took, timeout)
				}
				ts[r] = s.tr
			}
			noSetupGoroutines(t)
			for _, c := range foreign {
				closedWithin(t, c, bound)
			}
			exchange(t, ts, 1<<20, 0)
		})
	}
}

// TestTransportImpersonator: a foreign listener that does not hold the
// job's secret, whose address is published as rank 1's, is refused by
// rank 0's dialer at its first connection, however it answers: with the
// handshake under another key, with a forged acceptance, with garbage, or
// not at all (then at the handshake timeout, not New's). The error names
// peer 1, and the foreign listener receives nothing beyond the handshake:
// no hello, no data.
func TestTransportImpersonator(t *testing.T) {
	other := auth.NewKey([]byte("not the job's secret"), testKey.Job())
	for _, tc := range []struct {
		name  string
		serve func(c net.Conn) // the foreign listener's side
		want  error
	}{
		{"another key", func(c net.Conn) {
			auth.Accept(c, other, shakePurpose("t", 1, c.LocalAddr().String()), time.Now().Add(5*time.Second))
		}, ErrDenied},
		{"forged acceptance", func(c net.Conn) {
			hello := append([]byte("SLMGAUTH\x02"), make([]byte, 32)...)
			rand.Read(hello[9:])
			c.Write(hello)
			io.ReadFull(c, make([]byte, handshakeProof))
			forged := make([]byte, 1+32)
			rand.Read(forged[1:])
			c.Write(forged) // status accepted, and a made-up proof
		}, ErrDenied},
		{"garbage", func(c net.Conn) {
			junk := make([]byte, 100)
			rand.Read(junk)
			c.Write(junk)
		}, ErrDenied},
		{"silent", func(c net.Conn) {}, fault.ErrTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const timeout = 20 * time.Second
			st := testStore(t, 2) // rank 0, the foreign party
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			var (
				mu       sync.Mutex
				accepted int
				received []byte
				wg       sync.WaitGroup
			)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					mu.Lock()
					accepted++
					mu.Unlock()
					wg.Add(1)
					go func() {
						defer wg.Done()
						defer c.Close()
						tc.serve(c)
						c.SetReadDeadline(time.Now().Add(timeout))
						b, _ := io.ReadAll(c) // until the dialer hangs up
						mu.Lock()
						received = append(received, b...)
						mu.Unlock()
					}()
				}
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := st[1].Set(ctx, "t/addr/1", []byte(ln.Addr().String())); err != nil {
				t.Fatal(err)
			}
			cfg := rankConfig(st[0], 0, testKey, timeout)
			d := await(t, start(t, cfg), timeout+5*time.Second)
			checkConnectErr(t, "rank 0", d.err, 1, tc.want)
			if bound := cfg.HandshakeTimeout + 5*time.Second; d.took > bound {
				t.Errorf("rank 0 failed after %v, not within %v", d.took, bound)
			}
			ln.Close()
			wg.Wait()
			if accepted != 1 {
				t.Errorf("rank 0 made %d connections to the impersonator, want 1", accepted)
			}
			if len(received) > 0 {
				t.Errorf("rank 0 sent %d bytes to the impersonator beyond the handshake", len(received))
			}
		})
	}
}

// TestTransportUnexpectedHello: a connection that passes the handshake
// but then names a rank that is not an expected peer, a channel out of
// range, a channel already connected, or sends a data frame instead of a
// hello, is closed and does not count; the real ones still connect.
func TestTransportUnexpectedHello(t *testing.T) {
	const timeout = 10 * time.Second
	st := testStore(t, 2)
	cfg := rankConfig(st[1], 1, testKey, timeout)
	cfg.Channels = 2
	acceptor := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	addr, err := st[0].Get(ctx, "t/addr/1")
	if err != nil {
		t.Fatal(err)
	}
	// dial connects as a member of the job and sends h.
	dial := func(h Header) net.Conn {
		t.Helper()
		c, err := net.DialTimeout("tcp", string(addr), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if err := auth.Connect(c, testKey, shakePurpose("t", 1, string(addr)), time.Now().Add(5*time.Second)); err != nil {
			t.Fatal(err)
		}
		var b [HeaderSize]byte
		h.Put(b[:])
		if _, err := c.Write(b[:]); err != nil {
			t.Fatal(err)
		}
		return c
	}
	hello := func(rank, ch int) Header { return Header{Kind: KindHello, Sender: uint32(rank), Epoch: uint64(ch)} }
	first := dial(hello(0, 0)) // counts
	bound := cfg.HandshakeTimeout + 5*time.Second
	// The acceptor greets connections concurrently, so a second hello for
	// the same channel may be greeted before the first: whichever comes
	// second is closed, and the other keeps the channel.
	t.Run("channel taken", func(t *testing.T) {
		dup := dial(hello(0, 0))
		closed := make(chan net.Conn, 2)
		for _, c := range []net.Conn{first, dup} {
			go func() {
				c.SetReadDeadline(time.Now().Add(bound))
				if _, err := io.Copy(io.Discard, c); !errors.Is(err, os.ErrDeadlineExceeded) {
					closed <- c
				}
			}()
		}
		select {
		case <-closed:
		case <-time.After(bound + time.Second):
			t.Fatalf("the transport left both connections of channel 0 open for %v", bound)
		}
		select {
		case <-closed:
			t.Fatal("the transport closed both connections of channel 0")
		case <-time.After(500 * time.Millisecond):
		}
	})
	for _, tc := range []struct {
		name string
		h    Header
	}{
		{"unknown rank", hello(7, 1)},
		{"this rank", hello(1, 1)},
		{"channel out of range", hello(0, 2)},
		// on a channel not yet connected: taken for a hello, it would be
		// rank 0's channel 1
		{"data frame", Header{Kind: KindData, Sender: 0, Epoch: 1, Count: 1, Total: 1, Stripes: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) { closedWithin(t, dial(tc.h), bound) })
	}
	select {
	case s := <-acceptor:
		t.Fatalf("New returned before its last channel connected: %v", s.err)
	default:
	}
	dial(hello(0, 1))
	if s := await(t, acceptor, timeout+5*time.Second); s.err != nil {
		t.Fatal(s.err)
	}
	noSetupGoroutines(t)
}

// TestTransportPublishedAddress: an address read from the store is dialed
// only if it is a literal ip:port with a port in 1–65535; a host name or
// anything else fails New at once with ErrBadAddress naming the peer.
func TestTransportPublishedAddress(t *testing.T) {
	for _, addr := range []string{
		"localhost:1234", "example.invalid:80", "garbage", "", "127.0.0.1", "127.0.0.1:0",
		"127.0.0.1:65536", "127.0.0.1:-1", "127.0.0.1:http", "[::1]:", "1.2.3.4:80:90",
		"127.0.0.1:22 ", strings.Repeat("x", 10000),
	} {
		t.Run(addr[:min(len(addr), 20)], func(t *testing.T) {
			const timeout = 20 * time.Second
			st := testStore(t, 2)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := st[1].Set(ctx, "t/addr/1", []byte(addr)); err != nil {
				t.Fatal(err)
			}
			d := await(t, start(t, rankConfig(st[0], 0, testKey, timeout)), timeout+5*time.Second)
			checkConnectErr(t, "rank 0", d.err, 1, ErrBadAddress)
			if d.took > 5*time.Second {
				t.Errorf("rank 0 refused %q after %v", addr, d.took)
			}
			if len(d.err.Error()) > 500 {
				t.Errorf("the error quotes the whole address: %d bytes", len(d.err.Error()))
			}
		})
	}
}

// FuzzParseAddr: parseAddr never panics, and what it accepts is a literal
// IP and a port in 1–65535, returned unchanged.
func FuzzParseAddr(f *testing.F) {
	for _, s := range []string{"127.0.0.1:80", "[::1]:65535", "localhost:80", "1.2.3.4:0", "[fe80::1%eth0]:1", ":80", "1.2.3.4:080"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := parseAddr(s)
		if err != nil {
			if !errors.Is(err, ErrBadAddress) {
				t.Fatalf("parseAddr(%q): %v, not ErrBadAddress", s, err)
			}
			return
		}
		host, port, err := net.SplitHostPort(got)
		if got != s || err != nil || net.ParseIP(host) == nil {
			t.Fatalf("parseAddr(%q) = %q: not a literal ip:port (%v)", s, got, err)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 || strings.ContainsAny(port, "+- ") {
			t.Fatalf("parseAddr(%q): port %q accepted", s, port)
		}
	})
}
