package rendezvous

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/slimego/slimego/internal/auth"
	"github.com/slimego/slimego/internal/machine"
)

// Server hosts the key-value store. Create one with [Listen].
type Server struct {
	ln  net.Listener
	cfg ServerConfig
	key auth.Key

	frameLimit uint32 // largest request frame, from cfg.MaxValueBytes

	mu      sync.Mutex
	data    map[string][]byte
	bytes   int64         // keys and values of data, summed
	changed chan struct{} // closed and replaced on every mutation
	conns   map[net.Conn]struct{}
	pending []pendingConn // connections in their handshake, oldest first
	aborts  []abortRecord // oldest first, at most maxAborts
	// abortAt indexes aborts by prefix, abortLens holds their prefixes'
	// lengths, distinct and ascending (abortFor).
	abortAt   map[string]int
	abortLens []int
	waiting   int // requests blocked in handle
	// abortSeq counts the aborts recorded, deleteSeq the keys deleted
	// (abortedWait).
	abortSeq, deleteSeq uint64
	// waitingKeys sums the bytes of the distinct keys that the requests
	// blocked in handle hold for as long as they wait, and of each one's
	// list of them (keySlot a key): at most MaxTotalBytes. The blocked
	// requests share one copy of each key (waitKeys), but not their
	// lists: requests that wait on the same many keys cost a slot per key
	// each (a Barrier waits on one key).
	waitingKeys int64
	waitKeys    map[string]*waitKey
	closed      bool
	wg          sync.WaitGroup
}

// Auth is what every connection to a store must prove it holds: the job's
// secret (empty: the connection is bound to the job but nothing is proven)
// and the job's id.
type Auth struct {
	Secret []byte
	Job    string
}

func (a Auth) key() auth.Key { return auth.NewKey(a.Secret, a.Job) }

// ServerConfig configures a [Server]. The limits bound what clients can
// make the server hold, even clients that passed the handshake; a zero
// field takes its default.
type ServerConfig struct {
	Auth
	// HandshakeTimeout bounds a new connection's proof of membership
	// (default DefaultHandshakeTimeout): a connection that does not finish
	// it in time is closed.
	HandshakeTimeout time.Duration
	// MaxValueBytes is the largest value a Set or CompareAndSet may store
	// (default DefaultMaxValueBytes, at most 256 MiB); a larger one is
	// refused ([ErrBadRequest]). The largest frame the server reads derives
	// from it (two values and 4 MiB of keys): a frame that announces more
	// is refused, and skipped, without being allocated. Keys are at most
	// [MaxKeyBytes] long.
	MaxValueBytes int
	// MaxTotalBytes bounds the keys and values stored, summed (default
	// DefaultMaxTotalBytes); a set beyond it is refused. It bounds as well,
	// apart, the keys of the requests blocked at once (Get, Wait), which
	// they hold for as long as they wait, and their lists of them (16
	// bytes a key and request): a wait beyond it is refused
	// (ErrBadRequest).
	MaxTotalBytes int64
	// MaxKeys bounds how many keys the store holds (default
	// DefaultMaxKeys); a set of a new key beyond it is refused.
	MaxKeys int
	// MaxConns bounds the connections served at once, handshakes included
	// (default DefaultMaxConns); a connection beyond it is closed at once.
	// When all are taken and the oldest connection still in its handshake
	// has been so for evictAge (half a second, or half HandshakeTimeout),
	// that one is closed to make room instead: connections that never
	// prove anything cannot lock the job's ranks out for HandshakeTimeout,
	// and a burst of members, whose handshakes take a round trip, evicts
	// no one.
	MaxConns int
	// FrameTimeout bounds the arrival of one request frame once its first
	// byte has come, and the sending of one response (default
	// DefaultFrameTimeout): a client that stalls mid-frame, or does not
	// read its answers, is dropped. A connection idle between frames is
	// kept: ranks hold theirs for the whole job.
	FrameTimeout time.Duration
	// OnRefused, if set, is called (on the connection's goroutine) when a
	// connection's proof of membership is refused: a client of another
	// job, or with another secret, or one that does not speak the
	// protocol; not for one that closes or goes silent mid-handshake. A
	// launcher tells its user there, since the refused client's job
	// otherwise just waits for the rank that never joins.
	OnRefused func(remote string, err error)
}

// Defaults of [ServerConfig].
const (
	DefaultHandshakeTimeout = 5 * time.Second
	DefaultMaxValueBytes    = 1 << 20
	DefaultMaxTotalBytes    = 64 << 20
	DefaultMaxKeys          = 1 << 16
	// DefaultMaxConns: every rank holds one connection for the whole job,
	// so the bound must pass the largest job; each costs a goroutine and a
	// 4 KiB reader.
	DefaultMaxConns     = 16384
	DefaultFrameTimeout = 10 * time.Second
)

// withDefaults fills cfg's zero limits with their defaults.
func (cfg ServerConfig) withDefaults() (ServerConfig, error) {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&cfg.MaxValueBytes, DefaultMaxValueBytes)
	def(&cfg.MaxKeys, DefaultMaxKeys)
	def(&cfg.MaxConns, DefaultMaxConns)
	if cfg.MaxTotalBytes <= 0 {
		cfg.MaxTotalBytes = DefaultMaxTotalBytes
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.FrameTimeout <= 0 {
		cfg.FrameTimeout = DefaultFrameTimeout
	}
	if cfg.MaxValueBytes > maxValueLimit {
		return cfg, fmt.Errorf("rendezvous: MaxValueBytes %d exceeds the %d-byte limit", cfg.MaxValueBytes, maxValueLimit)
	}
	return cfg, nil
}

// purpose tells store connections from the transport's in the handshake.
const purpose = "rendezvous"

// Listen binds addr ("host:port"; port 0 picks a free port, see [Server.Addr])
// and serves the store on it until [Server.Close]. Every connection must
// first prove that it holds cfg's secret and job id.
func Listen(addr string, cfg ServerConfig) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("rendezvous: listen %s: %w", addr, err)
	}
	s := &Server{
		ln:         ln,
		cfg:        cfg,
		key:        cfg.key(),
		frameLimit: frameLimit(cfg.MaxValueBytes),
		data:       make(map[string][]byte),
		changed:    make(chan struct{}),
		conns:      make(map[net.Conn]struct{}),
		waitKeys:   make(map[string]*waitKey),
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
		// Every connection in its handshake holds one of the process's
		// share of descriptors for connections from anyone
		// (machine.TakeUnproven; given back when it leaves s.pending).
		// Where the share is taken, as out of descriptors: those silent
		// in their handshake for evictAge make room, and the others wait
		// in the listener's queue meanwhile (in turn: a member's
		// connection is not closed for a flood's). Members that have
		// proven themselves hold none: MaxConns bounds them.
		if !machine.TakeUnproven() {
			s.mu.Lock()
			closed := s.closed
			if !closed {
				s.evictAged()
			}
			s.mu.Unlock()
			if closed {
				return
			}
			if !machine.TakeUnproven() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
		}
		c, err := s.ln.Accept()
		if err != nil {
			machine.ReleaseUnproven()
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors (EMFILE, ENFILE: the process's limit is
			// below MaxConns, and a flood of connections, anyone's, reached
			// it), or another transient failure: the members still to join
			// must find the store serving. Out of descriptors, the
			// connections that have been silent in their handshake for
			// evictAge make room, as at MaxConns (a flood that goes on
			// would otherwise keep the store at its limit, evicting no one).
			s.mu.Lock()
			closed := s.closed
			if !closed && (errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)) {
				s.evictAged()
			}
			s.mu.Unlock()
			if closed {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			machine.ReleaseUnproven()
			return
		}
		if len(s.conns) >= s.cfg.MaxConns && len(s.pending) > 0 && time.Since(s.pending[0].since) >= s.evictAge() {
			old := s.pending[0].c
			s.pending = s.pending[1:]
			machine.ReleaseUnproven()
			delete(s.conns, old)
			old.Close()
		}
		if len(s.conns) >= s.cfg.MaxConns {
			s.mu.Unlock()
			c.Close() // full: the client sees the handshake fail
			machine.ReleaseUnproven()
			continue
		}
		s.conns[c] = struct{}{}
		s.pending = append(s.pending, pendingConn{c, time.Now()})
		s.wg.Add(1)
		s.mu.Unlock()
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetNoDelay(true)
		}
		go s.serve(c)
	}
}

// evictAged closes, under s.mu, the connections that have been in their
// handshake for evictAge (their serve goroutines then end). s.pending is
// in the order the connections came, so the walk stops at the first one
// younger than that: a flood's backlog is not walked every time.
func (s *Server) evictAged() {
	age := s.evictAge()
	n := 0
	for n < len(s.pending) && time.Since(s.pending[n].since) >= age {
		p := s.pending[n]
		delete(s.conns, p.c)
		p.c.Close()
		machine.ReleaseUnproven()
		n++
	}
	clear(s.pending[:n])
	s.pending = s.pending[n:]
}

// pendingConn is a connection in its handshake, since when.
type pendingConn struct {
	c     net.Conn
	since time.Time
}

// evictAge is how long a handshake must have lasted before a new
// connection to a full server may close it: far longer than a member's
// round trip.
func (s *Server) evictAge() time.Duration {
	return min(500*time.Millisecond, s.cfg.HandshakeTimeout/2)
}

func (s *Server) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	err := auth.Accept(c, s.key, purpose, time.Now().Add(s.cfg.HandshakeTimeout))
	s.mu.Lock()
	for i, p := range s.pending {
		if p.c == c {
			s.pending = append(s.pending[:i], s.pending[i+1:]...)
			machine.ReleaseUnproven()
			break
		}
	}
	s.mu.Unlock()
	if err != nil {
		if errors.Is(err, auth.ErrRefused) && s.cfg.OnRefused != nil {
			s.cfg.OnRefused(c.RemoteAddr().String(), err)
		}
		return // not a member of this job, silent, or evicted
	}
	// A fixed-size reader: it never grows with the frames.
	r := bufio.NewReaderSize(c, 4<<10)
	var buf, out []byte
	for {
		// Idle between frames for as long as the client likes; once a
		// frame has begun, all of it within FrameTimeout.
		c.SetReadDeadline(time.Time{})
		if _, err := r.Peek(1); err != nil {
			return // EOF or closed
		}
		c.SetReadDeadline(time.Now().Add(s.cfg.FrameTimeout))
		var resp message
		req, err := readFrame(r, &buf, s.frameLimit)
		var big *frameTooLargeError
		switch {
		case errors.As(err, &big):
			// Skip the body through a small buffer: the frame is refused,
			// the connection stays in step.
			if _, err := io.CopyN(io.Discard, r, int64(big.N)); err != nil {
				return
			}
			resp = message{Code: statusBadRequest, Value: fmt.Appendf(nil, "frame of %d bytes exceeds the server's %d-byte limit (values of at most %d bytes)", big.N, big.Limit, s.cfg.MaxValueBytes)}
		case err != nil:
			return // closed, stalled mid-frame, or malformed: drop the client
		default:
			// No frame is being read while the request is handled: the
			// hang-up watch must not time out.
			c.SetReadDeadline(time.Time{})
			// The request holds what it needs (its keys copied): a
			// large frame's buffer is let go before it may block for
			// as long as its timeout.
			if cap(buf) > keepBufBytes {
				buf = nil
			}
			w := hangupWatch{c: c, r: r}
			resp = s.handle(&req, &w)
			w.stop()
		}
		out = resp.encode(out[:0])
		c.SetWriteDeadline(time.Now().Add(s.cfg.FrameTimeout))
		if _, err := c.Write(out); err != nil {
			return
		}
		// One large frame must not pin its memory for the connection's
		// life (ranks hold theirs for the whole job); a large request's
		// buffer was let go before it was handled.
		if cap(out) > keepBufBytes {
			out = nil
		}
	}
}

// handle executes one request. Blocking requests wait on s.changed, bounded
// by the request's timeout.
//
// A blocked request also ends when its client hangs up (gone, see
// hangupWatch): a rank that cancelled or died must not hold its connection,
// its goroutine and a MaxConns slot until its timeout.
func (s *Server) handle(req *message, w *hangupWatch) message {
	var deadline <-chan time.Time
	if req.TimeoutMS > 0 {
		t := time.NewTimer(time.Duration(req.TimeoutMS) * time.Millisecond)
		defer t.Stop()
		deadline = t.C
	}
	held := false // req.Keys are counted in s.waitKeys
	var seen waitScan
	defer func() {
		if held {
			s.mu.Lock()
			s.releaseKeys(req.Keys)
			s.mu.Unlock()
		}
	}()
	for {
		s.mu.Lock()
		resp, block := s.apply(req)
		if block {
			if a, ok := s.abortedWait(req, &seen); ok {
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
		if deadline == nil { // zero timeout: do not block at all
			s.mu.Unlock()
			return message{Code: statusTimeout}
		}
		if !held {
			// A blocking request has no use for the value fields: they
			// would keep the frame they are slices of.
			req.Value, req.Value2 = nil, nil
			if n, mine := s.holdKeys(req.Keys); n > s.cfg.MaxTotalBytes {
				s.releaseKeys(req.Keys)
				s.mu.Unlock()
				return message{Code: statusBadRequest, Value: fmt.Appendf(nil, "the blocked requests would hold %d bytes of keys with this one's %d, beyond the server's %d-byte limit (MaxTotalBytes)", n, mine, s.cfg.MaxTotalBytes)}
			}
			held = true
		}
		s.waiting++
		s.mu.Unlock()
		var gone <-chan struct{}
		if w != nil {
			gone = w.start()
		}
		var timedOut bool
		select {
		case <-ch:
		case <-deadline:
			timedOut = true
		case <-gone:
			timedOut = true // nobody reads the answer
		}
		s.mu.Lock()
		s.waiting--
		s.mu.Unlock()
		if timedOut {
			return message{Code: statusTimeout}
		}
	}
}

// waitKey is one key that blocked requests hold, shared by n of them.
type waitKey struct {
	k string
	n int
}

// holdKeys counts keys, under s.mu, as held by a blocked request, and
// points them at the copy the blocked requests share. It returns the
// bytes they then hold in all and those this request adds: its list's
// slots and the keys new to them.
func (s *Server) holdKeys(keys []string) (total, added int64) {
	added = keySlot * int64(len(keys))
	for i, k := range keys {
		e := s.waitKeys[k]
		if e == nil {
			e = &waitKey{k: k}
			s.waitKeys[k] = e
			added += int64(len(k))
		}
		e.n++
		keys[i] = e.k
	}
	s.waitingKeys += added
	return s.waitingKeys, added
}

// keySlot is what a blocked request's list holds per key: a string
// header.
const keySlot = 16

// releaseKeys undoes holdKeys, under s.mu.
func (s *Server) releaseKeys(keys []string) {
	s.waitingKeys -= keySlot * int64(len(keys))
	for _, k := range keys {
		e := s.waitKeys[k]
		if e.n--; e.n == 0 {
			delete(s.waitKeys, k)
			s.waitingKeys -= int64(len(k))
		}
	}
}

// hangupWatch notices, while a request of its connection waits, that the
// client hung up: it peeks at the connection's reader in a goroutine of its
// own (the serve loop does not read while a request is handled). A client
// that sends data instead only ends the watch; the data stays buffered for
// the serve loop.
type hangupWatch struct {
	c    net.Conn
	r    *bufio.Reader
	gone chan struct{} // closed when the client hung up
	done chan struct{} // closed when the watching goroutine returned
}

// start starts the watch, once, and returns the channel closed on hang-up.
func (w *hangupWatch) start() <-chan struct{} {
	if w.done == nil {
		w.gone, w.done = make(chan struct{}), make(chan struct{})
		go func() {
			defer close(w.done)
			if _, err := w.r.Peek(1); err != nil {
				if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
					return // stopped by stop
				}
				close(w.gone)
			}
		}()
	}
	return w.gone
}

// stop ends a started watch and waits for its goroutine, so that the serve
// loop has the reader to itself again; the loop resets the read deadline.
func (w *hangupWatch) stop() {
	if w.done == nil {
		return
	}
	w.c.SetReadDeadline(time.Unix(1, 0))
	<-w.done
	w.done = nil
}

// apply executes req under s.mu. block reports that the request waits for a
// key that does not exist yet.
func (s *Server) apply(req *message) (resp message, block bool) {
	bad := func(format string, a ...any) message {
		return message{Code: statusBadRequest, Value: fmt.Appendf(nil, format, a...)}
	}
	needKeys := func(n int) bool { return len(req.Keys) == n }
	for _, k := range req.Keys {
		if len(k) > MaxKeyBytes {
			return bad("%s: key of %d bytes exceeds the %d-byte limit", op(req.Code), len(k), MaxKeyBytes), false
		}
	}
	switch op(req.Code) {
	case opSet:
		if !needKeys(1) {
			return bad("set takes one key"), false
		}
		if why := s.put(req.Keys[0], req.Value); why != "" {
			return bad("set %q: %s", req.Keys[0], why), false
		}
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
		if req.N > 0 && cur > math.MaxInt64-req.N || req.N < 0 && cur < math.MinInt64-req.N {
			return bad("add %d to %q (%d): past the counter's range", req.N, req.Keys[0], cur), false
		}
		cur += req.N
		if why := s.put(req.Keys[0], strconv.AppendInt(nil, cur, 10)); why != "" {
			return bad("add %q: %s", req.Keys[0], why), false
		}
		return message{Code: statusOK, N: cur}, false
	case opCompareAndSet:
		if !needKeys(1) {
			return bad("compare-and-set takes one key"), false
		}
		k := req.Keys[0]
		v, ok := s.data[k]
		// A missing key matches an empty expected value, as in TCPStore.
		if (!ok && len(req.Value) == 0) || (ok && string(v) == string(req.Value)) {
			if why := s.put(k, req.Value2); why != "" {
				return bad("compare-and-set %q: %s", k, why), false
			}
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
		v, ok := s.data[req.Keys[0]]
		if !ok {
			return message{Code: statusNotFound}, false
		}
		s.bytes -= int64(len(req.Keys[0]) + len(v))
		delete(s.data, req.Keys[0])
		s.deleteSeq++
		s.notify()
		return message{Code: statusOK}, false
	case opNumKeys:
		return message{Code: statusOK, N: int64(len(s.data))}, false
	case opAbort:
		if !needKeys(1) {
			return bad("abort takes one key (the prefix)"), false
		}
		reason := req.Value
		if len(reason) > maxReasonBytes {
			reason = reason[:maxReasonBytes]
		}
		s.abort(req.Keys[0], int(req.N), string(reason))
		return message{Code: statusOK}, false
	}
	return bad("unknown op %d", req.Code), false
}

// put stores a copy of v (the request buffer is reused) and wakes
// waiters, under s.mu. It refuses, saying why, a value or a store beyond
// the configured limits.
func (s *Server) put(k string, v []byte) (refused string) {
	if len(v) > s.cfg.MaxValueBytes {
		return fmt.Sprintf("value of %d bytes exceeds the %d-byte limit", len(v), s.cfg.MaxValueBytes)
	}
	old, exists := s.data[k]
	total := s.bytes + int64(len(v))
	if exists {
		total -= int64(len(old))
	} else {
		if len(s.data) >= s.cfg.MaxKeys {
			return fmt.Sprintf("the store holds %d keys, its limit", len(s.data))
		}
		total += int64(len(k))
	}
	if total > s.cfg.MaxTotalBytes {
		return fmt.Sprintf("the store would hold %d bytes, beyond its %d-byte limit", total, s.cfg.MaxTotalBytes)
	}
	s.data[k] = append([]byte(nil), v...)
	s.bytes = total
	s.notify()
	return ""
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

// maxReasonBytes bounds the reason an abort keeps.
const maxReasonBytes = 4 << 10

// abortRecord is one aborted prefix: who aborted it and why.
type abortRecord struct {
	prefix string
	rank   int
	reason string
	seq    uint64 // the server's abortSeq when it was recorded
}

// waitScan is what a blocked request's last abortedWait saw: the aborts
// recorded and the keys deleted by then. A request's missing keys only
// shrink while no key is deleted, so that it need check only the aborts
// recorded since: each wake-up of a wait on many keys then costs its keys
// times the new aborts (usually none), not times all of them.
type waitScan struct{ aborts, deletes uint64 }

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
	s.abortSeq++
	s.aborts = append(s.aborts, abortRecord{prefix: prefix, rank: rank, reason: reason, seq: s.abortSeq})
	s.abortAt, s.abortLens = make(map[string]int, len(s.aborts)), s.abortLens[:0]
	for i, a := range s.aborts {
		s.abortAt[a.prefix] = i // prefixes are distinct (above)
		if j, found := slices.BinarySearch(s.abortLens, len(a.prefix)); !found {
			s.abortLens = slices.Insert(s.abortLens, j, len(a.prefix))
		}
	}
	s.notify()
}

// abortFor returns, under s.mu, the first abort from aborts[first:] whose
// prefix starts key k. A waiter's first check takes each of its missing
// keys (up to MaxCallKeys) against every abort recorded (up to
// maxAborts): compared one by one, that held the server's lock for
// seconds, and every other call, new connections' among them, waited.
// The index looks up each length of prefix instead.
func (s *Server) abortFor(k string, first int) (abortRecord, bool) {
	if len(s.aborts)-first <= len(s.abortLens) {
		for _, a := range s.aborts[first:] {
			if strings.HasPrefix(k, a.prefix) {
				return a, true
			}
		}
		return abortRecord{}, false
	}
	best := -1
	for _, n := range s.abortLens {
		if n > len(k) {
			break
		}
		if i, ok := s.abortAt[k[:n]]; ok && i >= first && (best < 0 || i < best) {
			best = i
		}
	}
	if best < 0 {
		return abortRecord{}, false
	}
	return s.aborts[best], true
}

// abortedWait reports, under s.mu, the abort that fails blocking request
// req: the first recorded abort whose prefix starts one of req's missing
// keys.
func (s *Server) abortedWait(req *message, seen *waitScan) (abortRecord, bool) {
	since := seen.aborts
	if seen.deletes != s.deleteSeq {
		since = 0 // a key deleted since may be missing now: check it against every abort
	}
	*seen = waitScan{aborts: s.abortSeq, deletes: s.deleteSeq}
	if len(s.aborts) == 0 || s.aborts[len(s.aborts)-1].seq <= since {
		return abortRecord{}, false
	}
	first := 0 // the first abort recorded after since
	for first < len(s.aborts) && s.aborts[first].seq <= since {
		first++
	}
	for _, k := range req.Keys {
		if _, ok := s.data[k]; ok {
			continue
		}
		if a, ok := s.abortFor(k, first); ok {
			return a, true
		}
	}
	return abortRecord{}, false
}

// Set stores a copy of value at key and wakes its waiters, as a client's
// Set does: a write for the process that hosts the server. It fails, with
// ErrBadRequest, beyond the server's limits.
func (s *Server) Set(key string, value []byte) error {
	if len(key) > MaxKeyBytes {
		return fmt.Errorf("%w: set: key of %d bytes exceeds the %d-byte limit", ErrBadRequest, len(key), MaxKeyBytes)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if why := s.put(key, value); why != "" {
		return fmt.Errorf("%w: set %q: %s", ErrBadRequest, key, why)
	}
	return nil
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
