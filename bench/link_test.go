package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/internal/auth"
	"github.com/slimego/slimego/internal/testranks"
)

// TestLinkStalledPeer: rank 1 opens the plain connections and then sends
// nothing; rank 0's duplex transfer must end at the communicator's timeout
// with an error that names both ranks and the operation, not hang.
func TestLinkStalledPeer(t *testing.T) {
	const timeout = 2 * time.Second
	done := make(chan struct{})
	testranks.Run(t, 2, 1, func(o *collective.Options) { o.Timeout = timeout }, func(c *collective.Communicator) error {
		l, err := openLink(context.Background(), c, "127.0.0.1", 2, 0)
		if err != nil {
			return err
		}
		defer l.close()
		if c.Rank() == 1 {
			<-done // stalled: neither reads nor writes
			return nil
		}
		defer close(done)
		n := 1 << 20
		res := make(chan error, 1)
		t0 := time.Now()
		go func() { res <- l.duplex(make([]byte, n), make([]byte, n)) }()
		select {
		case err = <-res:
		case <-time.After(3 * timeout):
			l.close() // ends the transfer, so that the test can report
			return fmt.Errorf("duplex with a stalled peer still waiting after %v", 3*timeout)
		}
		took := time.Since(t0)
		if !errors.Is(err, os.ErrDeadlineExceeded) || !strings.Contains(fmt.Sprint(err), "rank 0 with rank 1") || !strings.Contains(fmt.Sprint(err), "duplex") {
			return fmt.Errorf("duplex with a stalled peer: err = %v, want a deadline error naming ranks 0 and 1 and the duplex transfer", err)
		}
		if took < timeout/2 {
			return fmt.Errorf("duplex with a stalled peer gave up after %v, before the %v timeout", took, timeout)
		}
		return nil
	})
}

// TestLinkWrongPerPlacement: a wrong byte is charged to the placement
// whose gather got it wrong: an in-place gather that does nothing leaves
// the out-of-place row clean (its CSV row was marked wrong too).
func TestLinkWrongPerPlacement(t *testing.T) {
	testHookLinkCheck = func(inPlace bool, _ []byte, run func(context.Context) error) func(context.Context) error {
		if inPlace {
			return func(context.Context) error { return nil } // every rank alike: no peer waits
		}
		return run
	}
	defer func() { testHookLinkCheck = nil }()
	got := linkRows(t)[0]
	if len(got) != 1 {
		t.Fatalf("%d rows, want 1", len(got))
	}
	if r := got[0]; r.Wrong != 0 || r.WrongIn == 0 {
		t.Errorf("out of place %d wrong bytes, in place %d: want 0 and some (only the in-place gather did nothing)", r.Wrong, r.WrongIn)
	}
}

// TestLinkStranger: a process that reaches rank 0's listener before rank
// 1 does, without the job's key (or with it, but a bad hello), is not
// taken for rank 1: its connection is closed, the real rank 1's
// connections make the link, and a duplex transfer over it delivers
// each rank's bytes to the other, stripe by stripe.
func TestLinkStranger(t *testing.T) {
	const channels = 2
	cases := []struct {
		name string
		// greet is what the stranger does once connected; key is the
		// job's.
		greet func(c net.Conn, key auth.Key) error
	}{
		{"silent", func(net.Conn, auth.Key) error { return nil }},
		{"junk", func(c net.Conn, _ auth.Key) error {
			_, err := c.Write(bytes.Repeat([]byte("rank 1 "), 20))
			return err
		}},
		{"other secret", func(c net.Conn, key auth.Key) error {
			return auth.Connect(c, auth.NewKey([]byte("a guess"), key.Job()), "bench", time.Now().Add(5*time.Second))
		}},
		{"other purpose", func(c net.Conn, key auth.Key) error {
			return auth.Connect(c, key, "transport", time.Now().Add(5*time.Second))
		}},
		{"bad hello", func(c net.Conn, key auth.Key) error {
			if err := auth.Connect(c, key, "bench", time.Now().Add(5*time.Second)); err != nil {
				return err
			}
			_, err := c.Write(bytes.Repeat([]byte{0xff}, 64))
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var strangers []net.Conn
			defer func() {
				for _, s := range strangers {
					s.Close()
				}
			}()
			var key auth.Key
			testHookLinkDial = func(addr string) {
				for range channels { // as many as the link has
					s, err := net.DialTimeout("tcp", addr, 5*time.Second)
					if err != nil {
						t.Errorf("stranger: dial %s: %v", addr, err)
						return
					}
					strangers = append(strangers, s)
					go tc.greet(s, key) // its own outcome does not matter
				}
				time.Sleep(100 * time.Millisecond) // rank 0 accepts the strangers first
			}
			defer func() { testHookLinkDial = nil }()
			testranks.Run(t, 2, 1, func(o *collective.Options) {
				o.Timeout = 10 * time.Second // RunInProcess gives the job a secret
			}, func(c *collective.Communicator) error {
				if c.Rank() == 1 {
					key = auth.NewKey(c.Options().JobSecret, c.Options().JobID)
				}
				l, err := openLink(context.Background(), c, "127.0.0.1", channels, 0)
				if err != nil {
					return err
				}
				defer l.close()
				if len(l.conns) != channels {
					return fmt.Errorf("rank %d: %d connections, want %d", c.Rank(), len(l.conns), channels)
				}
				const n = 1 << 16
				out, in := make([]byte, n), make([]byte, n)
				for i := range out {
					out[i] = byte(i*7 + c.Rank() + 1)
				}
				if err := l.duplex(out, in); err != nil {
					return err
				}
				for i := range in {
					if want := byte(i*7 + (1 - c.Rank()) + 1); in[i] != want {
						return fmt.Errorf("rank %d: byte %d from rank %d is %#x, want %#x", c.Rank(), i, 1-c.Rank(), in[i], want)
					}
				}
				return nil
			})
			for i, s := range strangers { // rank 0 hung up on every one
				s.SetReadDeadline(time.Now().Add(5 * time.Second))
				if _, err := io.Copy(io.Discard, s); errors.Is(err, os.ErrDeadlineExceeded) {
					t.Errorf("stranger %d: its connection is still open after the link was made", i)
				}
			}
		})
	}
}

// TestLinkSilentStrangersFillPending: as many silent connections as rank
// 0 greets at once reach its listener first; rank 1 then opens the link,
// which must pair: the oldest handshake under way gives way to a new
// connection (as the transport's do), and rank 1 dials again after a
// failed handshake, until the deadline.
func TestLinkSilentStrangersFillPending(t *testing.T) {
	key := auth.NewKey([]byte("secret"), "job")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := l.(*net.TCPListener)
	addr := ln.Addr().String()
	for range linkMaxPending {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	deadline := time.Now().Add(4 * time.Second)
	type dialed struct {
		conns []*net.TCPConn
		err   error
	}
	out := make(chan dialed, 1)
	go func() {
		time.Sleep(100 * time.Millisecond)
		conns, err := dialLink(addr, key, 2, deadline)
		out <- dialed{conns, err}
	}()
	conns, err := acceptLink(context.Background(), ln, key, 2, deadline)
	d := <-out
	for _, c := range append(conns, d.conns...) {
		c.Close()
	}
	if err != nil || d.err != nil {
		t.Errorf("rank 0: %v\nrank 1: %v", err, d.err)
	}
}

// TestLinkWrongEveryRank: the wrong columns count the wrong bytes of
// every rank's destination, as slimebench allgather's do: each rank
// counted its own and rank 0 printed its own alone, so that a gather wrong
// on rank 1 only printed 0 and exited 0. Here each rank's gather leaves one
// wrong byte in its destination: 2 in all, in each placement.
func TestLinkWrongEveryRank(t *testing.T) {
	testHookLinkCheck = func(inPlace bool, dst []byte, run func(context.Context) error) func(context.Context) error {
		return func(ctx context.Context) error {
			err := run(ctx)
			dst[len(dst)-1] ^= 0xff
			return err
		}
	}
	defer func() { testHookLinkCheck = nil }()
	for rank, rs := range linkRows(t) {
		if len(rs) != 1 {
			t.Fatalf("rank %d: %d rows, want 1", rank, len(rs))
		}
		if r := rs[0]; r.Wrong != 2 || r.WrongIn != 2 {
			t.Errorf("rank %d: out of place %d wrong bytes, in place %d: want 2 and 2 (one on each rank)", rank, r.Wrong, r.WrongIn)
		}
	}
}

// TestLinkLaterCallsChecked: as slimebench allgather's, Link's gathers are
// checked again after the timed calls, on another round's data: a gather
// right on its first call and doing nothing after it (a broken plan)
// printed 0 wrong bytes in link's CSV, only the first call being checked.
func TestLinkLaterCallsChecked(t *testing.T) {
	testHookLinkCheck = func(inPlace bool, _ []byte, run func(context.Context) error) func(context.Context) error {
		calls := 0
		return func(ctx context.Context) error {
			if calls++; calls == 1 {
				return run(ctx)
			}
			return nil // every rank alike: no peer waits
		}
	}
	defer func() { testHookLinkCheck = nil }()
	got := linkRows(t)[0]
	if len(got) != 1 {
		t.Fatalf("%d rows, want 1", len(got))
	}
	// Out of place 2·2·4096 bytes could be wrong, in place 2·1·4096.
	if r := got[0]; r.Wrong < 2*2*4096*9/10 || r.Wrong > 2*2*4096 || r.WrongIn < 2*4096*9/10 || r.WrongIn > 2*4096 {
		t.Errorf("out of place %d wrong bytes, in place %d: want nearly all of 16384 and 8192 (the gathers did nothing after their first call)", r.Wrong, r.WrongIn)
	}
}

// linkRows runs Link of 4096 bytes on two loopback nodes of one rank each
// and returns each rank's rows.
func linkRows(t *testing.T) [2][]LinkResult {
	t.Helper()
	var got [2][]LinkResult
	testranks.Run(t, 2, 1, func(o *collective.Options) { o.Timeout = 30 * time.Second }, func(c *collective.Communicator) error {
		rs, err := Link(context.Background(), c, "127.0.0.1", []int64{4096}, 1, 0, 1, 0, nil)
		got[c.Rank()] = rs
		return err
	})
	return got
}
