package rendezvous

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/slimego/slimego/internal/auth"
)

// Server hosts the key-value store. Create one with [Listen].
type Server struct {
	ln  net.Listener
	cfg ServerConfig
	key auth.Key

	mu      sync.Mutex
	data    map[string][]byte
	changed chan struct{} // closed and replaced on every mutation
	conns   map[net.Conn]struct{}
	aborts  []abortRecord // oldest first, at most maxAborts
	closed  bool
	wg      sync.WaitGroup
}

// Auth is what every connection to a store must prove it holds: the job's
// secret (empty: the connection is bound to the job but nothing is proven)
// and the job's id.
type Auth struct {
	Secret []byte
	Job    string
}

func (a Auth) key() auth.Key { return auth.NewKey(a.Secret, a.Job) }

// ServerConfig configures a [Server].
type ServerConfig struct {
	Auth
	// HandshakeTimeout bounds a new connection's proof of membership
	// (default DefaultHandshakeTimeout).
	HandshakeTimeout time.Duration
}

// DefaultHandshakeTimeout bounds the handshake of a new connection.
const DefaultHandshakeTimeout = 5 * time.Second

// purpose tells store connections from the transport's in the handshake.
const purpose = "rendezvous"

// Listen binds addr ("host:port"; port 0 picks a free port, see [Server.Addr])
// and serves the store on it until [Server.Close]. Every connection must
// first prove that it holds cfg's secret and job id.
func Listen(addr string, cfg ServerConfig) (*Server, error) {
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("rendezvous: listen %s: %w", addr, err)
	}
	s := &Server{
		ln:      ln,
		cfg:     cfg,
		key:     cfg.key(),
		data:    make(map[string][]byte),
		changed: make(chan struct{}),
		conns:   make(map[net.Conn]struct{}),
	}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Addr is the address the server listens on, with the port it was given.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Port is the TCP port the server listens on.
func (s *Server) Port() int { return s.ln.Addr().(*net.TCPAddr).Port }

// Shutdown stops accepting, then waits up to grace for the clients to hang
// up (a rank hosting the store lets the others finish with it), and closes.
// The clients it waits for are those it has accepted (every client that
// has had an answer has been); a connection still in the listener's queue
// is dropped.
func (s *Server) Shutdown(grace time.Duration) error {
	s.ln.Close()
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		n := len(s.conns)
		s.mu.Unlock()
		if n == 0 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	return s.Close()
}

// Close stops the server, drops every client connection and wakes every
// blocked request. It waits for the server's goroutines to end.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.ln.Close()
	var err error
	for c := range s.conns {
		c.Close()
	}
	// Wakes every waiter for good: notify does nothing from now on.
	close(s.changed)
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetNoDelay(true)
		}
		go s.serve(c)
	}
}

func (s *Server) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	if err := auth.Accept(c, s.key, purpose, time.Now().Add(s.cfg.HandshakeTimeout)); err != nil {
		return // not a member of this job
	}
	r := bufio.NewReader(c)
	var buf, out []byte
	for {
		req, err := readFrame(r, &buf)
		if err != nil {
			return // EOF, closed, or a malformed frame: drop the client
		}
		resp := s.handle(&req)
		out = resp.encode(out[:0])
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

// handle executes one request. Blocking requests wait on s.changed, bounded
// by the request's timeout.
func (s *Server) handle(req *message) message {
	var deadline <-chan time.Time
	if req.TimeoutMS > 0 {
		t := time.NewTimer(time.Duration(req.TimeoutMS) * time.Millisecond)
		defer t.Stop()
		deadline = t.C
	}
	for {
		s.mu.Lock()
		resp, block := s.apply(req)
		if block {
			if a, ok := s.abortedWait(req); ok {
				s.mu.Unlock()
				return message{Code: statusAborted, Keys: []string{a.prefix}, N: int64(a.rank), Value: []byte(a.reason)}
			}
		}
		if !block || s.closed {
			s.mu.Unlock()
			if block {
				return message{Code: statusTimeout}
			}
			return resp
		}
		ch := s.changed
		s.mu.Unlock()
		if deadline == nil { // zero timeout: do not block at all
			return message{Code: statusTimeout}
		}
		select {
		case <-ch:
		case <-deadline:
			return message{Code: statusTimeout}
		}
	}
}

// apply executes req under s.mu. block reports that the request waits for a
// key that does not exist yet.
func (s *Server) apply(req *message) (resp message, block bool) {
	bad := func(format string, a ...any) message {
		return message{Code: statusBadRequest, Value: fmt.Appendf(nil, format, a...)}
	}
	needKeys := func(n int) bool { return len(req.Keys) == n }
	switch op(req.Code) {
	case opSet:
		if !needKeys(1) {
			return bad("set takes one key"), false
		}
		s.put(req.Keys[0], req.Value)
		return message{Code: statusOK}, false
	case opGet:
		if !needKeys(1) {
			return bad("get takes one key"), false
		}
		v, ok := s.data[req.Keys[0]]
		if !ok {
			return message{}, true
		}
		return message{Code: statusOK, Value: v}, false
	case opAdd:
		if !needKeys(1) {
			return bad("add takes one key"), false
		}
		var cur int64
		if v, ok := s.data[req.Keys[0]]; ok {
			n, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil {
				return bad("add: key %q holds %q, not an integer", req.Keys[0], v), false
			}
			cur = n
		}
		cur += req.N
		s.put(req.Keys[0], strconv.AppendInt(nil, cur, 10))
		return message{Code: statusOK, N: cur}, false
	case opCompareAndSet:
		if !needKeys(1) {
			return bad("compare-and-set takes one key"), false
		}
		k := req.Keys[0]
		v, ok := s.data[k]
		// A missing key matches an empty expected value, as in TCPStore.
		if (!ok && len(req.Value) == 0) || (ok && string(v) == string(req.Value)) {
			s.put(k, req.Value2)
			return message{Code: statusOK, Value: req.Value2}, false
		}
		if !ok {
			return message{Code: statusNotFound}, false
		}
		return message{Code: statusFalse, Value: v}, false
	case opWait:
		for _, k := range req.Keys {
			if _, ok := s.data[k]; !ok {
				return message{}, true
			}
		}
		return message{Code: statusOK}, false
	case opCheck:
		for _, k := range req.Keys {
			if _, ok := s.data[k]; !ok {
				return message{Code: statusFalse}, false
			}
		}
		return message{Code: statusOK}, false
	case opDelete:
		if !needKeys(1) {
			return bad("delete takes one key"), false
		}
		if _, ok := s.data[req.Keys[0]]; !ok {
			return message{Code: statusNotFound}, false
		}
		delete(s.data, req.Keys[0])
		s.notify()
		return message{Code: statusOK}, false
	case opNumKeys:
		return message{Code: statusOK, N: int64(len(s.data))}, false
	case opAbort:
		if !needKeys(1) {
			return bad("abort takes one key (the prefix)"), false
		}
		s.abort(req.Keys[0], int(req.N), string(req.Value))
		return message{Code: statusOK}, false
	}
	return bad("unknown op %d", req.Code), false
}

// put stores a copy of v (the request buffer is reused) and wakes waiters.
func (s *Server) put(k string, v []byte) {
	s.data[k] = append([]byte(nil), v...)
	s.notify()
}

// notify wakes every blocked request, under s.mu. Once the server is
// closed it does nothing: Close has closed s.changed for good (closing it
// again would panic while holding s.mu, and the serve goroutine's deferred
// Lock would then deadlock Close's wait), and every waiter that wakes sees
// s.closed.
func (s *Server) notify() {
	if s.closed {
		return
	}
	close(s.changed)
	s.changed = make(chan struct{})
}

// maxAborts bounds the aborted prefixes a server keeps: beyond it the
// oldest is forgotten (a launcher aborts one prefix per attempt, so the
// newest are those whose ranks may still be waiting).
const maxAborts = 1024

// abortRecord is one aborted prefix: who aborted it and why.
type abortRecord struct {
	prefix string
	rank   int
	reason string
}

// Abort fails, at once, every blocking request (Get, Wait) on a key that
// starts with prefix and does not exist: those waiting now wake up, and
// those that come later are answered without waiting. rank and reason
// reach every such waiter as an [AbortError]. Keys that exist still read,
// and non-blocking ops work as before. It is for the process that hosts
// the server (a launcher that saw a worker exit); others use
// [Client.Abort]. An empty prefix aborts every wait. Aborting a prefix
// again keeps its first rank and reason.
func (s *Server) Abort(prefix string, rank int, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.abort(prefix, rank, reason)
}

// abort records prefix under s.mu and wakes the waiters.
func (s *Server) abort(prefix string, rank int, reason string) {
	for _, a := range s.aborts {
		if a.prefix == prefix {
			return
		}
	}
	if len(s.aborts) >= maxAborts {
		s.aborts = append(s.aborts[:0], s.aborts[1:]...)
	}
	s.aborts = append(s.aborts, abortRecord{prefix: prefix, rank: rank, reason: reason})
	s.notify()
}

// abortedWait reports, under s.mu, the abort that fails blocking request
// req: the first recorded abort whose prefix starts one of req's missing
// keys.
func (s *Server) abortedWait(req *message) (abortRecord, bool) {
	if len(s.aborts) == 0 {
		return abortRecord{}, false
	}
	for _, k := range req.Keys {
		if _, ok := s.data[k]; ok {
			continue
		}
		for _, a := range s.aborts {
			if strings.HasPrefix(k, a.prefix) {
				return a, true
			}
		}
	}
	return abortRecord{}, false
}

// Lookup returns a copy of key's value, and whether it exists, without
// waiting: a read for the process that hosts the server.
func (s *Server) Lookup(key string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.data[key]
	if !ok {
		return nil, false
	}
	return append([]byte{}, v...), true
}

// errServerClosed is what a request sees when the server went away under it.
var errServerClosed = errors.New("rendezvous: server closed the connection")
