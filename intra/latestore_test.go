package intra

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/teststore"
	"github.com/slimego/slimego/rendezvous"
)

// TestAllocSurvivesLateStoreAnswer: a store that answers one of an Alloc's
// bookkeeping calls (the count of the ranks done with the sizes) late, but
// well within the Alloc's own deadline, costs nothing: the Alloc and the
// next one succeed on every rank. (Before, that count had a second of its
// own even when the Alloc had more: a store slower than that and the
// client's answer slack cost rank 1 its store connection, and its next
// wait failed "connection to store lost", as once in a loaded CI run.)
func TestAllocSurvivesLateStoreAnswer(t *testing.T) {
	const L = 2
	addr := teststore.Serve(t, rendezvous.ServerConfig{})
	// Rank 1 reaches the store through a proxy that holds back the
	// answer to its first request naming the key of that count.
	delayed := lateProxy(t, addr, []byte("/n/read"), 3500*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	prefix := fmt.Sprintf("slimego-test-%d-late-", os.Getpid())
	errs := make([]error, L)
	var wg sync.WaitGroup
	for r := range L {
		wg.Go(func() {
			errs[r] = func() error {
				a := addr
				if r == 1 {
					a = delayed.addr
				}
				st, err := rendezvous.Dial(ctx, a, rendezvous.Auth{})
				if err != nil {
					return err
				}
				defer st.Close()
				g, err := New(ctx, Config{Store: st, Key: "t", ShmPrefix: prefix, Rank: r, Size: L, Timeout: 20 * time.Second})
				if err != nil {
					return err
				}
				defer g.Close()
				for i := range 2 {
					octx, ocancel := context.WithTimeout(ctx, 20*time.Second)
					b, err := g.Alloc(octx, 4096)
					ocancel()
					if err != nil {
						return fmt.Errorf("alloc %d: %w", i, err)
					}
					if err := b.Free(); err != nil {
						return fmt.Errorf("free %d: %w", i, err)
					}
				}
				return nil
			}()
		})
	}
	wg.Wait()
	if !delayed.held.Load() {
		t.Fatal("the proxy held back no answer: the test tests nothing")
	}
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	if left, _ := os.ReadDir("/dev/shm"); left != nil {
		for _, e := range left {
			if bytes.HasPrefix([]byte(e.Name()), []byte(prefix)) {
				t.Errorf("/dev/shm/%s left behind", e.Name())
			}
		}
	}
}

// lateStoreProxy forwards one connection to a store, holding back for a
// while the store's answer to the first request that contains a marker.
type lateStoreProxy struct {
	addr string
	held atomic.Bool // an answer was held back
}

// lateProxy listens on loopback and forwards the first connection it
// accepts to the store at store; the first chunk of the store's answer
// that follows a request containing marker is held back for delay.
// Requests go one at a time on a store connection, so that chunk is that
// request's answer.
func lateProxy(t *testing.T, store string, marker []byte, delay time.Duration) *lateStoreProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &lateStoreProxy{addr: ln.Addr().String()}
	var armed, done atomic.Bool
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		s, err := net.Dial("tcp", store)
		if err != nil {
			return
		}
		defer s.Close()
		// Client to store: look for the marker (within one chunk: a
		// request's keys arrive in one write).
		wg.Go(func() {
			buf := make([]byte, 64<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					if !done.Load() && bytes.Contains(buf[:n], marker) {
						armed.Store(true)
					}
					if _, werr := s.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					s.(*net.TCPConn).CloseWrite()
					return
				}
			}
		})
		// Store to client: hold back the first chunk after the marker.
		buf := make([]byte, 64<<10)
		for {
			n, err := s.Read(buf)
			if n > 0 {
				if armed.Load() && !done.Load() {
					done.Store(true)
					p.held.Store(true)
					time.Sleep(delay)
				}
				if _, werr := c.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				if err != io.EOF {
					return
				}
				c.(*net.TCPConn).CloseWrite()
				return
			}
		}
	})
	return p
}
