package launcher

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slimego/slimego/rendezvous"
)

// stallProxy forwards loopback TCP connections to addr; while stalled
// is set it forwards nothing (a node 0 paused, or a link that drops
// packets for a while).
type stallProxy struct {
	ln      net.Listener
	stalled atomic.Bool
	mu      sync.Mutex
	conns   []net.Conn
}

func newStallProxy(t *testing.T, addr string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			go p.pipe(c, s)
			go p.pipe(s, c)
		}
	}()
	t.Cleanup(p.close)
	return p
}

func (p *stallProxy) pipe(dst, src net.Conn) {
	b := make([]byte, 32<<10)
	for {
		n, err := src.Read(b)
		for p.stalled.Load() {
			time.Sleep(10 * time.Millisecond)
		}
		if n > 0 {
			if _, werr := dst.Write(b[:n]); werr != nil {
				return
			}
		}
		if err != nil { // EOF or a cut: the other side sees it too
			dst.Close()
			return
		}
	}
}

// close stops listening and cuts every connection: the store's host gone.
func (p *stallProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}

// TestWatchSurvivesStalledStore: a node's failure and end watches whose
// connections to node 0's store stall past the wait's answer (node 0's
// launcher paused, packets lost for seconds) reach the store again and
// report nothing; once node 0 has set the end key, the store going away
// is its end, reported as nothing. A store that goes away before
// the end key (nothing listens: node 0's launcher died) is reported
// within seconds as node 0's death.
func TestWatchSurvivesStalledStore(t *testing.T) {
	defer func(d time.Duration) { watchTimeout = d }(watchTimeout)
	watchTimeout = 300 * time.Millisecond
	cfg := &Config{RunID: "stall", JobSecret: []byte("s"), NNodes: 2, NProcPerNode: 1, NodeRank: 1}
	for _, ends := range []bool{true, false} {
		srv, err := rendezvous.Listen("127.0.0.1:0", rendezvous.ServerConfig{Auth: cfg.auth()})
		if err != nil {
			t.Fatal(err)
		}
		px := newStallProxy(t, srv.Addr().String())
		j := &job{cfg: cfg, storeAddr: px.ln.Addr().String()}
		ctx, cancel := context.WithCancel(context.Background())
		remote := make(chan *rendezvous.AbortError, 1)
		done, endDone := make(chan struct{}), make(chan struct{})
		go func() { defer close(done); j.watchFailures(ctx, 0, remote, nil) }()
		go func() { defer close(endDone); j.watchEnd(ctx) }()
		time.Sleep(500 * time.Millisecond)
		px.stalled.Store(true)
		time.Sleep(4 * time.Second) // the wait's answer is 2 s overdue meanwhile
		px.stalled.Store(false)
		select {
		case ae := <-remote:
			t.Fatalf("a stall of 4 s was reported: %s", ae.Reason)
		case <-time.After(2 * time.Second):
		}
		if ends {
			if err := srv.Set(endKey(cfg.RunID), nil); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(10 * time.Second); !j.node0Ended.Load(); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the end key was not seen 10 s after it was set")
				}
			}
		}
		t0 := time.Now()
		px.close()
		srv.Close()
		select {
		case ae := <-remote:
			if ends {
				t.Fatalf("the store's end after the end key was reported: %s", ae.Reason)
			}
			if !strings.HasPrefix(ae.Reason, "node 0's launcher died") || ae.Rank != 0 || !isLost(0, ae.Reason) {
				t.Fatalf("store gone: rank %d, %q", ae.Rank, ae.Reason)
			}
		case <-time.After(5 * time.Second):
			if !ends {
				t.Fatalf("a store gone was not reported %v after", time.Since(t0).Round(time.Millisecond))
			}
		}
		cancel()
		for _, c := range []chan struct{}{done, endDone} {
			select {
			case <-c:
			case <-time.After(10 * time.Second):
				t.Fatal("a watch did not return after its context ended")
			}
		}
	}
}
