package rendezvous

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/slimego/slimego/internal/auth"
	"github.com/slimego/slimego/internal/netaddr"
)

var (
	// ErrTimeout: a blocking call reached its deadline before its keys existed.
	ErrTimeout = errors.New("rendezvous: timeout")
	// ErrUnreachable: Dial could not connect before its deadline.
	ErrUnreachable = errors.New("rendezvous: store unreachable")
	// ErrConnLost: the connection to the store broke during a call.
	ErrConnLost = errors.New("rendezvous: connection to store lost")
	// ErrClosed: the client was closed.
	ErrClosed = errors.New("rendezvous: client closed")
	// ErrBadRequest: the server refused the request (for example Add on a
	// key that does not hold an integer).
	ErrBadRequest = errors.New("rendezvous: bad request")
	// ErrDenied: the store refused this client's proof of membership (a
	// different secret or job id), or it is not a slimego store.
	ErrDenied = errors.New("rendezvous: store denied the connection")
	// ErrAborted: a blocking call's key falls under a prefix that someone
	// aborted ([Server.Abort], [Client.Abort]); the error is an
	// [*AbortError] that says who and why.
	ErrAborted = errors.New("rendezvous: aborted")
	// ErrBadAnswer: the store answered a call with a status the call does
	// not expect (a newer or faulty store: "not found" for a Set, say): the
	// call fails rather than take it for success.
	ErrBadAnswer = errors.New("rendezvous: unexpected answer")
)

// AbortError is what a blocking call (Get, Wait, Barrier) returns when its
// key falls under an aborted prefix: the prefix, the rank that aborted it
// (as its aborter gave it; a launcher gives the rank that exited) and the
// reason. errors.Is(err, ErrAborted) holds for it.
type AbortError struct {
	Prefix string
	Rank   int
	Reason string
}

func (e *AbortError) Error() string {
	return fmt.Sprintf("rendezvous: aborted (prefix %q) by rank %d: %s", e.Prefix, e.Rank, e.Reason)
}

// Is makes errors.Is(err, ErrAborted) true.
func (e *AbortError) Is(target error) bool { return target == ErrAborted }

// DefaultTimeout bounds calls whose context carries no deadline.
const DefaultTimeout = 5 * time.Minute

// Client is a connection to a [Server]. Its methods are safe for concurrent
// use; calls on one client are served one at a time.
type Client struct {
	addr string
	auth Auth // what Dial proved, for Redial
	// Timeout bounds calls whose context has no deadline; DefaultTimeout
	// when zero.
	Timeout time.Duration

	// lock is held (full) by the call or Close that uses the
	// connection: a call waits for it no longer than its deadline.
	lock   chan struct{}
	conn   net.Conn
	r      *bufio.Reader
	buf    []byte
	out    []byte
	broken error
}

// Dial connects to the store at addr and proves that it holds a's secret
// and job id, retrying until ctx is done (or for DefaultTimeout when ctx
// has no deadline): a launcher's store may come up after its workers. The
// error names the address it tried. A store that refuses the proof is
// [ErrDenied] at once (a connection closed before the verdict, by a store
// at its connection limit for instance, is retried), and a host name that does not resolve is
// [ErrUnreachable] within netaddr.ResolveTimeout (2 s): waiting would not
// make it resolve. A ctx cancelled before a connection is made is
// ErrUnreachable wrapping ctx's error (context.Canceled).
func Dial(ctx context.Context, addr string, a Auth) (*Client, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	start := time.Now()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrUnreachable, addr, err)
	}
	// Once, bounded, before the retries: an unknown name fails now. The
	// loop looks the name up again each time, so that an address that
	// changes while the store comes up is followed.
	if _, err := netaddr.ResolveIP(host); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrUnreachable, addr, err)
	}
	backoff := 5 * time.Millisecond
	var d net.Dialer
	for {
		// The address a store of this name listens on (netaddr.ListenIP
		// binds the name's first IPv4 address), not the name: dialled,
		// the name's other addresses would be tried too (localhost's ::1
		// first), where the store's port is free and any user of the
		// host may listen, and relay the connection (the handshake
		// passes a relay untouched) while reading what it carries.
		var conn net.Conn
		ip, err := netaddr.ResolveIP(host)
		if err == nil {
			conn, err = d.DialContext(ctx, "tcp", net.JoinHostPort(ip.String(), port))
		}
		if err == nil {
			conn.(*net.TCPConn).SetNoDelay(true)
			hs := time.Now().Add(DefaultHandshakeTimeout)
			if dl, ok := ctx.Deadline(); ok && dl.Before(hs) {
				hs = dl
			}
			herr := auth.Connect(conn, a.key(), purpose, hs)
			if herr == nil {
				return &Client{addr: addr, auth: a, lock: make(chan struct{}, 1), conn: conn, r: bufio.NewReader(conn)}, nil
			}
			conn.Close()
			if errors.Is(herr, auth.ErrRefused) {
				return nil, fmt.Errorf("%w: %s: %v", ErrDenied, addr, herr)
			}
			// The connection failed before a verdict: a store at its
			// connection limit, a handshake it evicted, or one that ran
			// out of time on a loaded host. Those pass; try again.
			err = herr
		}
		if dnsErr, ok := errors.AsType[*net.DNSError](err); ok && dnsErr.IsNotFound {
			// The name stopped resolving since the check above.
			return nil, fmt.Errorf("%w: %s: %v", ErrUnreachable, addr, err)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			if cerr := ctx.Err(); errors.Is(cerr, context.Canceled) {
				// Given up, not out of time: the caller tells them apart.
				return nil, fmt.Errorf("%w: %s: %v (tried for %v): %w", ErrUnreachable, addr, err, time.Since(start).Round(time.Millisecond), cerr)
			}
			return nil, fmt.Errorf("%w: %s: %v (tried for %v)%s", ErrUnreachable, addr, err, time.Since(start).Round(time.Millisecond), manyAddrs(host))
		case <-t.C:
		}
		backoff = min(backoff*2, 500*time.Millisecond)
	}
}

// manyAddrs is, for a Dial that failed, a note where host is a name of
// several addresses: Dial tries the first IPv4 one alone (the one a store
// of that name binds), and a store bound to another (SLIME_SOCKET_IFNAME,
// or a resolver that orders the addresses otherwise on the store's host)
// is reached by giving its address itself.
func manyAddrs(host string) string {
	if net.ParseIP(host) != nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), netaddr.ResolveTimeout)
	defer cancel()
	ips, err := net.DefaultResolver.LookupIP(ctx, "ip", host)
	if err != nil || len(ips) < 2 {
		return ""
	}
	first, _ := netaddr.ResolveIP(host)
	return fmt.Sprintf("; %s has the addresses %v, and only %v, the first IPv4 one, is dialled: where the store listens on another, give that address (MASTER_ADDR) instead of the name", host, ips, first)
}

// Addr is the address of the store.
func (c *Client) Addr() string { return c.addr }

// Redial connects again to c's store, as Dial did for c: another client,
// for a call that must not wait behind c's (calls on one client are
// served one at a time: an Abort behind a Get that it would end).
func (c *Client) Redial(ctx context.Context) (*Client, error) { return Dial(ctx, c.addr, c.auth) }

// Close closes the connection.
func (c *Client) Close() error {
	c.lock <- struct{}{}
	defer func() { <-c.lock }()
	if c.broken == ErrClosed {
		return nil
	}
	c.broken = ErrClosed
	return c.conn.Close()
}

// call sends req and reads the response. blocking requests carry the time
// left before the deadline so that the server answers statusTimeout itself.
func (c *Client) call(ctx context.Context, req *message, blocking bool) (message, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		t := c.Timeout
		if t <= 0 {
			t = DefaultTimeout
		}
		deadline = time.Now().Add(t)
	}
	if len(req.Keys) > MaxCallKeys {
		// Nothing is sent: a count cut to the wire's 16 bits would be a
		// malformed frame, and the store would hang up.
		return message{}, fmt.Errorf("%w: %s on %d keys at %s: a call names at most %d", ErrBadRequest, op(req.Code), len(req.Keys), c.addr, MaxCallKeys)
	}
	left := time.Until(deadline)
	if left <= 0 {
		// Nothing is sent: the connection stays usable (a socket
		// deadline already past would fail the write and give it up).
		return message{}, fmt.Errorf("%w: %s %s at %s", ErrTimeout, op(req.Code), keysText(req.Keys), c.addr)
	}
	// Another call may hold the connection (a Get blocked on its key):
	// wait for it until this call's deadline, no longer.
	if err := c.acquire(ctx, left); err != nil {
		if err == context.Canceled {
			return message{}, fmt.Errorf("rendezvous: %s %s at %s: %w", op(req.Code), keysText(req.Keys), c.addr, err)
		}
		return message{}, fmt.Errorf("%w: %s %s at %s: another call held the connection past the deadline", ErrTimeout, op(req.Code), keysText(req.Keys), c.addr)
	}
	defer func() { <-c.lock }()
	if left = time.Until(deadline); left <= 0 {
		// As above: nothing sent, the connection kept.
		return message{}, fmt.Errorf("%w: %s %s at %s", ErrTimeout, op(req.Code), keysText(req.Keys), c.addr)
	}
	if err := ctx.Err(); err == context.Canceled {
		// Cancelled before anything was sent: the connection is kept
		// (cancelled mid-call it could not be).
		return message{}, fmt.Errorf("rendezvous: %s %s at %s: %w", op(req.Code), keysText(req.Keys), c.addr, err)
	}
	if blocking {
		req.TimeoutMS = uint32(min(max(left.Milliseconds(), 1), 1<<31))
	}
	if c.broken != nil {
		return message{}, c.broken
	}
	// The server bounds blocking waits itself; the slack lets its timeout
	// answer arrive before the socket deadline fires. A call the server
	// answers at once has it too: a live store that answers a moment past
	// the deadline (a loaded host) must not cost the connection, which a
	// socket deadline firing mid-call gives up, failing every later call
	// (a short cleanup call did so to a rank's next wait). A store that
	// does not answer at all fails a call answerSlack after its deadline.
	c.conn.SetDeadline(deadline.Add(answerSlack))
	// A cancelled call unblocks at once. A deadline does not break the
	// connection: the server answers statusTimeout at the deadline itself.
	stop := context.AfterFunc(ctx, func() {
		if ctx.Err() == context.Canceled {
			c.conn.SetDeadline(time.Unix(1, 0))
		}
	})
	defer stop()

	c.out = req.encode(c.out[:0])
	var resp message
	_, err := c.conn.Write(c.out)
	if err == nil {
		resp, err = readFrame(c.r, &c.buf, frameLimit(maxValueLimit))
	}
	// One large frame must not pin its memory for the client's life (resp
	// still holds what it needs of c.buf).
	if cap(c.buf) > keepBufBytes {
		c.buf = nil
	}
	if cap(c.out) > keepBufBytes {
		c.out = nil
	}
	if err != nil {
		if ctx.Err() == context.Canceled {
			// The connection is mid-frame: it cannot be reused.
			c.broken = fmt.Errorf("%w: %s: an earlier call was cancelled", ErrConnLost, c.addr)
			c.conn.Close()
			return message{}, fmt.Errorf("rendezvous: %s %s at %s: %w", op(req.Code), keysText(req.Keys), c.addr, ctx.Err())
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, errMalformed) {
			err = errServerClosed
		}
		c.broken = fmt.Errorf("%w: %s: %v", ErrConnLost, c.addr, err)
		c.conn.Close()
		return message{}, c.broken
	}
	switch resp.Code {
	case statusTimeout:
		return resp, fmt.Errorf("%w: %s %s at %s after %v", ErrTimeout, op(req.Code), keysText(req.Keys), c.addr, time.Duration(req.TimeoutMS)*time.Millisecond)
	case statusBadRequest:
		return resp, fmt.Errorf("%w: %s %s at %s: %s", ErrBadRequest, op(req.Code), keysText(req.Keys), c.addr, resp.Value)
	case statusAborted:
		ae := &AbortError{Rank: int(resp.N), Reason: string(resp.Value)}
		if len(resp.Keys) == 1 {
			ae.Prefix = resp.Keys[0]
		}
		return resp, fmt.Errorf("rendezvous: %s %s at %s: %w", op(req.Code), keysText(req.Keys), c.addr, ae)
	}
	if !answers(op(req.Code), resp.Code) {
		return resp, fmt.Errorf("%w: %s %s at %s: status %d", ErrBadAnswer, op(req.Code), keysText(req.Keys), c.addr, resp.Code)
	}
	// The response aliases c.buf; copy what outlives the lock.
	resp.Value = append([]byte(nil), resp.Value...)
	return resp, nil
}

// answers reports whether status answers a call of o that went through
// (the errors, Timeout, BadRequest and Aborted, aside): OK for every
// call; besides, "false" for a Check (a key missing), "not found" for a
// Delete, and either for a CompareAndSet (a key that holds another value,
// or none). Get and Wait wait for their keys: OK alone.
func answers(o op, status uint8) bool {
	switch status {
	case statusOK:
		return true
	case statusFalse:
		return o == opCheck || o == opCompareAndSet
	case statusNotFound:
		return o == opDelete || o == opCompareAndSet
	}
	return false
}

// acquire takes c.lock for a call, waiting at most left, or until ctx
// ends: ErrTimeout, or context.Canceled where ctx was cancelled.
func (c *Client) acquire(ctx context.Context, left time.Duration) error {
	select {
	case c.lock <- struct{}{}:
		return nil
	default:
	}
	t := time.NewTimer(left)
	defer t.Stop()
	select {
	case c.lock <- struct{}{}:
		return nil
	case <-t.C:
		return ErrTimeout
	case <-ctx.Done():
		if ctx.Err() == context.Canceled {
			return context.Canceled
		}
		return ErrTimeout
	}
}

// answerSlack is how long past its deadline a call waits for the server's
// answer (a blocking call's own timeout answer) before it gives the
// connection up.
const answerSlack = 2 * time.Second

// Set stores value under key, replacing any earlier value.
func (c *Client) Set(ctx context.Context, key string, value []byte) error {
	_, err := c.call(ctx, &message{Code: uint8(opSet), Keys: []string{key}, Value: value}, false)
	return err
}

// Get returns the value of key, waiting until some client sets it or ctx's
// deadline passes ([ErrTimeout]).
func (c *Client) Get(ctx context.Context, key string) ([]byte, error) {
	resp, err := c.call(ctx, &message{Code: uint8(opGet), Keys: []string{key}}, true)
	return resp.Value, err
}

// Add adds delta to the integer stored under key (0 when missing) and
// returns the new value; concurrent Adds are atomic.
func (c *Client) Add(ctx context.Context, key string, delta int64) (int64, error) {
	resp, err := c.call(ctx, &message{Code: uint8(opAdd), Keys: []string{key}, N: delta}, false)
	return resp.N, err
}

// CompareAndSet sets key to desired if it currently holds expected (an
// empty expected value matches a missing key). It returns the value the key
// holds afterwards and whether the swap happened.
func (c *Client) CompareAndSet(ctx context.Context, key string, expected, desired []byte) ([]byte, bool, error) {
	resp, err := c.call(ctx, &message{Code: uint8(opCompareAndSet), Keys: []string{key}, Value: expected, Value2: desired}, false)
	if err != nil {
		return nil, false, err
	}
	return resp.Value, resp.Code == statusOK, nil
}

// Wait blocks until every key exists or ctx's deadline passes ([ErrTimeout]).
// Keys that one frame cannot carry (more than MaxCallKeys, or more bytes
// than a frame's key list holds) are waited for a frame's worth at a time,
// all within the one deadline.
func (c *Client) Wait(ctx context.Context, keys ...string) error {
	_, err := c.allKeys(ctx, opWait, keys)
	return err
}

// Check reports whether every key exists, without waiting (a frame's worth
// of keys at a time, as Wait).
func (c *Client) Check(ctx context.Context, keys ...string) (bool, error) {
	return c.allKeys(ctx, opCheck, keys)
}

// allKeys runs op (opWait, which blocks, or opCheck) on keys, one frame's
// worth at a time within one deadline, and reports whether every frame
// was answered statusOK; it stops at the first that was not.
func (c *Client) allKeys(ctx context.Context, code op, keys []string) (bool, error) {
	if frameKeys(keys) < len(keys) {
		var cancel context.CancelFunc
		ctx, cancel = c.bounded(ctx)
		defer cancel()
	}
	for {
		n := frameKeys(keys)
		resp, err := c.call(ctx, &message{Code: uint8(code), Keys: keys[:n]}, code == opWait)
		if err != nil || resp.Code != statusOK { // call lets a Check's "false" through, and nothing else
			return false, err
		}
		if keys = keys[n:]; len(keys) == 0 {
			return true, nil
		}
	}
}

// bounded is ctx with the client's timeout as its deadline when it has
// none: the frames of one Wait or Check share it.
func (c *Client) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	t := c.Timeout
	if t <= 0 {
		t = DefaultTimeout
	}
	return context.WithTimeout(ctx, t)
}

// frameKeys is how many of keys, from the first, one frame carries: at
// most MaxCallKeys, whose length-prefixed bytes fit half a frame's key
// list (a key longer than a server takes goes alone, to be refused).
func frameKeys(keys []string) int {
	n, bytes := 0, 0
	for n < len(keys) && n < MaxCallKeys {
		bytes += lengthPrefix + len(keys[n])
		if n > 0 && bytes > maxKeyListBytes/2 {
			break
		}
		n++
	}
	return n
}

// keysText is keys for an error message: all of a few, else the first
// ones and how many more (a barrier's wait may name thousands), each cut
// to its first 120 characters.
func keysText(keys []string) string {
	const show = 4
	if len(keys) <= 2*show {
		return fmt.Sprintf("%.120q", keys)
	}
	q := fmt.Sprintf("%.120q", keys[:show])
	return fmt.Sprintf("%s … and %d more]", q[:len(q)-1], len(keys)-show)
}

// Delete removes key and reports whether it existed.
func (c *Client) Delete(ctx context.Context, key string) (bool, error) {
	resp, err := c.call(ctx, &message{Code: uint8(opDelete), Keys: []string{key}}, false)
	return err == nil && resp.Code == statusOK, err
}

// NumKeys returns how many keys the store holds.
func (c *Client) NumKeys(ctx context.Context) (int64, error) {
	resp, err := c.call(ctx, &message{Code: uint8(opNumKeys)}, false)
	return resp.N, err
}

// Abort fails every blocking call, now and later, on keys that start with
// prefix and do not exist yet (see [Server.Abort]): a launcher that saw a
// worker exit makes the ranks still waiting fail at once with an
// [*AbortError] carrying rank and reason, instead of waiting out their
// timeouts.
func (c *Client) Abort(ctx context.Context, prefix string, rank int, reason string) error {
	_, err := c.call(ctx, &message{Code: uint8(opAbort), Keys: []string{prefix}, N: int64(rank), Value: []byte(reason)}, false)
	return err
}

// MissingError is what Barrier returns when some members never arrived:
// their indices, and the store's error (ErrTimeout, ErrConnLost, an
// *AbortError, …), which it wraps.
type MissingError struct {
	Name    string
	Missing []int
	Err     error
	// AllArrived: every member's key is there, but one was not counted
	// in (its call failed in between, and it did not call again, or it
	// was stopped there).
	AllArrived bool
	// NotCounted: where AllArrived, the members whose keys say they
	// arrived and were not counted in yet.
	NotCounted []int
}

func (e *MissingError) Error() string {
	if e.AllArrived && len(e.NotCounted) > 0 {
		return fmt.Sprintf("rendezvous: barrier %q: every member arrived, but %v were not counted in (stopped or failed in the barrier's call, and did not call again): %v", e.Name, e.NotCounted[:min(len(e.NotCounted), 16)], e.Err)
	}
	if e.AllArrived {
		return fmt.Sprintf("rendezvous: barrier %q: every member arrived, but one was not counted in (its call failed between the two, and it did not call again): %v", e.Name, e.Err)
	}
	const show = 16
	if len(e.Missing) > show {
		return fmt.Sprintf("rendezvous: barrier %q: %v and %d more never arrived: %v", e.Name, e.Missing[:show], len(e.Missing)-show, e.Err)
	}
	return fmt.Sprintf("rendezvous: barrier %q: %v never arrived: %v", e.Name, e.Missing, e.Err)
}

func (e *MissingError) Unwrap() error { return e.Err }

// BarrierKey is the key member me sets when it reaches barrier name
// (Barrier): whoever can Check it knows that member has arrived, and
// waits in the barrier or has passed it.
func BarrierKey(name string, me int) string { return name + "/" + strconv.Itoa(me) }

// BarrierKeys are the keys a barrier of size members leaves in the store:
// its members' (BarrierKey), its count and the key its members wait on.
// Whoever knows that no member waits there any more may delete them.
func BarrierKeys(name string, size int) []string {
	keys := make([]string, 0, size+2)
	for i := range size {
		keys = append(keys, BarrierKey(name, i))
	}
	return append(keys, name+"/arrived", name+"/all")
}

// Barrier records that member me of size has reached name, then waits until
// every member has. If the wait fails it returns a *MissingError naming the
// members that never arrived.
//
// A member arrives once, however often it calls: its key (BarrierKey) is
// created by compare-and-set, and only the call that created it counts
// the member in (name+"/arrived"); the member that counts the last one
// sets name+"/all", which every member waits for. Each member so waits on
// one key, and a barrier of P members costs the store O(P), where waiting
// on every member's key cost P² key slots and as many checks per change.
// A later call of a member whose key is there already (an earlier call
// may have failed before it counted itself in) waits for every member's
// key instead, and then sets name+"/all" itself.
func (c *Client) Barrier(ctx context.Context, name string, me, size int) error {
	if size > MaxCallKeys {
		return fmt.Errorf("%w: barrier %q of %d members at %s: a barrier waits for at most %d", ErrBadRequest, name, size, c.addr, MaxCallKeys)
	}
	if me < 0 || me >= size {
		return fmt.Errorf("%w: barrier %q: member %d of %d", ErrBadRequest, name, me, size)
	}
	_, created, err := c.CompareAndSet(ctx, BarrierKey(name, me), nil, []byte{'1'})
	if err != nil {
		return err
	}
	keys := func() []string {
		keys := make([]string, size)
		for i := range keys {
			keys[i] = BarrierKey(name, i)
		}
		return keys
	}
	if created {
		n, err := c.Add(ctx, name+"/arrived", 1)
		if err != nil {
			return err
		}
		// Counted in: the key says so ('2'), so that where the barrier
		// times out with every member arrived, those stopped or failed
		// between the two (still '1') are named (before the last member
		// lets the others go: none of them deletes the keys before this
		// member has returned).
		if err := c.Set(ctx, BarrierKey(name, me), []byte{'2'}); err != nil {
			return err
		}
		if n == int64(size) {
			if err := c.Set(ctx, name+"/all", nil); err != nil {
				return err
			}
		}
	} else if err := c.Wait(ctx, keys()...); err == nil {
		// An earlier call of this member arrived, and may have failed
		// before it counted itself in: this one waits for every
		// member's key instead (as many key slots, for this member
		// alone), and completes the barrier.
		if err := c.Set(ctx, name+"/all", nil); err != nil {
			return err
		}
	}
	err = c.Wait(ctx, name+"/all")
	if err == nil {
		return nil
	}
	// A fresh context, the caller's having usually expired by now, for
	// all the checks together.
	check, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	missing, known := c.missing(check, keys(), 0)
	me2 := &MissingError{Name: name, Missing: missing, Err: err, AllArrived: known && len(missing) == 0}
	if me2.AllArrived {
		for i, k := range keys() {
			if v, gerr := c.Get(check, k); gerr == nil && string(v) == "1" {
				me2.NotCounted = append(me2.NotCounted, i)
			} else if gerr != nil {
				break
			}
		}
	}
	return me2
}

// missing returns the indices (from base) of keys that the store does not
// hold, checking halves of a range that is not all there: a few calls
// where few are missing, at most twice as many as keys where all are.
// known is false where a check failed: missing then holds what was
// learned before.
func (c *Client) missing(ctx context.Context, keys []string, base int) (missing []int, known bool) {
	if len(keys) == 0 {
		return nil, true
	}
	ok, err := c.Check(ctx, keys...)
	if err != nil {
		return nil, false
	}
	if ok {
		return nil, true
	}
	if len(keys) == 1 {
		return []int{base}, true
	}
	h := len(keys) / 2
	a, ka := c.missing(ctx, keys[:h], base)
	if !ka {
		return a, false
	}
	b, kb := c.missing(ctx, keys[h:], base+h)
	return append(a, b...), kb
}

// AttemptPrefix starts every store key of one attempt of a job: a launcher
// that restarts its workers gives each attempt keys of its own, and
// [Client.Abort] of this prefix fails the attempt's waits.
func AttemptPrefix(runID string, attempt int) string {
	if attempt == 0 {
		return "slimego/" + runID + "/"
	}
	return "slimego/" + runID + "-r" + strconv.Itoa(attempt) + "/"
}
