package p2p

import (
	"bytes"
	"cmp"
	"container/heap"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/inter"
	"github.com/slimego/slimego/internal/auth"
	"github.com/slimego/slimego/internal/machine"
	"github.com/slimego/slimego/internal/netaddr"
	"github.com/slimego/slimego/rendezvous"
)

// Options configure an Endpoint. Only Name is required.
type Options struct {
	// Name identifies the endpoint among its peers (unique in the job):
	// Connect finds a peer by it. At most MaxName bytes of UTF-8, no '/'.
	Name string
	// Store is the rendezvous store Publish and Connect use (nil: only
	// ConnectInfo works).
	Store *rendezvous.Client
	// Prefix is the store key prefix of this job's endpoints (default
	// "p2p"); the info of endpoint n is at Prefix+"/info/"+n. Under
	// slimerun, name it with collective.Options.StoreKey: slimerun aborts
	// the attempt's keys when any worker exits (with code 0 too), and a
	// Connect waiting for an info not yet published then fails at once
	// instead of at Timeout.
	Prefix string
	// Auth is the job's secret and run id: every connection proves both
	// ways that its two ends hold it, and which endpoint accepts it
	// (internal/auth, purpose "p2p:", the acceptor's name and address). The zero
	// Auth binds nothing and proves nothing.
	Auth rendezvous.Auth
	// ListenIP is the address to listen on; empty picks, as the
	// collectives do, that of IfName or the one that reaches MasterAddr,
	// and loopback when both are empty.
	ListenIP   string
	IfName     string
	MasterAddr string
	// Channels is the number of TCP connections of a link this endpoint
	// dials (default DefaultChannels, at most MaxChannels; a link has its
	// dialer's); an
	// operation of n bytes is striped over inter.Stripes(n, Channels) of
	// them.
	Channels int
	// Timeout bounds Connect and every Wait whose context has no deadline
	// (default 5 minutes).
	Timeout time.Duration
	// Heartbeat is how long a link may stay silent before its transfers
	// fail with ErrTimeout (default 5 s). Every connection carries a ping
	// every Heartbeat/4 when idle. A data frame (up to ChunkMax bytes)
	// must cross within one heartbeat too, so a link must move at least
	// ChunkMax per Heartbeat on each connection (0.8 MiB/s at the
	// default).
	Heartbeat time.Duration
	// HandshakeTimeout bounds one connection's handshake (default
	// inter.DefaultHandshakeTimeout).
	HandshakeTimeout time.Duration
	// OnRefuse, if set, is called (from a connection's goroutine; it must
	// not block) with each request this endpoint refused as a target: the
	// peer, the region and the cause. Refused() counts them.
	OnRefuse func(error)
	// TCPOnly carries every transfer over TCP, even to a peer on this
	// host (which otherwise copies with process_vm_readv/writev): to
	// measure TCP on one host, or where ptrace is not allowed.
	TCPOnly bool
}

// shakePurpose is the handshake's purpose on a connection to the endpoint
// named name listening at addr (as its Info publishes it): "p2p:", the
// name, "@" and the address, which the acceptor proves to be its own.
// With the job alone proven, whoever holds a port that a member dials
// (one an endpoint closed left, its Info still in the store) could hand
// the dialer's challenge to any member's listener, the dialer's own
// included, pass its proofs back, and then answer the link's hello itself
// as the endpoint the dialer meant: holding no secret, it would hold the
// link and read every byte sent on it. With the name alone, it could
// still hand it to a later endpoint of that name (a worker restarted
// under it) listening elsewhere; the address ties the proof to the
// listener the Info names, which a stale Info's is no more.
func shakePurpose(name, addr string) string { return purpose + ":" + name + "@" + addr }

// heartbeatMS is d in milliseconds, as a hello carries it.
func heartbeatMS(d time.Duration) uint32 {
	return uint32(min(max(d.Milliseconds(), 1), maxHeartbeatMS))
}

// Defaults.
const (
	// minHeartbeat bounds the heartbeat a link takes from its peer's hello.
	minHeartbeat     = 10 * time.Millisecond
	DefaultTimeout   = 5 * time.Minute
	DefaultHeartbeat = 5 * time.Second
	// DefaultChannels is the number of TCP connections of a link unless
	// Options.Channels says otherwise: twice the collectives'
	// (inter.DefaultChannels), since a transfer of several MiB, striped in
	// 512 KiB or more per connection, crossed a link faster over eight
	// connections than over four (docs/PERFORMANCE.md); an idle
	// connection costs a socket on each side, its goroutines and a ping
	// every Heartbeat/4. Lower it where a process links to many peers.
	DefaultChannels = 8
	// MaxChannels bounds the connections of one link (Options.Channels,
	// and a hello's count).
	MaxChannels = 64
	// maxImm bounds the immediates received and not yet taken by Imm,
	// and maxImmPeer those of one link: a peer that floods the queue
	// (or whose immediates the program leaves there) takes at most a
	// quarter of it, and the others' WriteWithImm still go through.
	maxImm     = 1 << 16
	maxImmPeer = maxImm / 4
	purpose    = "p2p"
)

// maxPendingRTS bounds the sends announced by a peer before their
// receives are posted; past it an announced send is refused (stBusy), and
// so many refused sequences are remembered, so that the receive of that
// rank fails at once instead of waiting for a send that will not come.
var maxPendingRTS = 1 << 16

// Endpoint is one process's side of the engine: its registered regions,
// its listener and its links to peers. Its methods are safe for concurrent
// use.
type Endpoint struct {
	opts  Options
	key   auth.Key
	ln    *net.TCPListener
	addr  string
	host  string
	done  chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	regs  map[uint64]*Region
	names map[string]struct{} // the registered regions' names
	next  uint64              // the next region id
	peers map[string]*Peer
	shut  bool
	// closed is closed when the first Close returns (a second Close
	// waits for it); closedRegs are the regions it withdrew and stopped
	// closes when the endpoint's goroutines have ended, from which a
	// later Close says again what the first said if it still holds.
	closed     chan struct{}
	closedRegs []*Region
	stopped    chan struct{}
	// mapCount and mapBytes count the peers' Shared memories that the
	// links map (shared_linux.go), within maxEndpointMaps and
	// maxMappedBytes.
	mapCount, mapBytes atomic.Int64

	immMu sync.Mutex
	// imms are the links' queues that hold undelivered immediates (a
	// peer linked again under the same name has another); seq orders
	// them across links (Endpoint.Imm). A queue holds no link: one left
	// here after its link's end keeps nothing else alive.
	imms   map[*immQueue]struct{}
	immN   int
	immSeq uint64
	// immGen is closed, and replaced, when an immediate is queued or a
	// link fails: every Imm waiting then looks again.
	immGen chan struct{}

	refused atomic.Int64
	// token, at an address its Info gives, proves to a peer on this host
	// that it may copy from this process (cma_linux.go).
	token *uint64
}

// Imm is an immediate a peer's WriteWithImm delivered, after the write's
// bytes.
type Imm struct {
	Peer  string
	Value uint32
}

// New listens and returns the endpoint. ctx bounds nothing that outlives
// New (the endpoint keeps no context).
func New(ctx context.Context, o Options) (*Endpoint, error) {
	if o.Name == "" {
		return nil, opErr("new", "", "", ErrInvalid, "Options.Name is empty")
	}
	if err := validName(o.Name); err != nil {
		return nil, &OpError{Op: "new", Err: err}
	}
	if o.Prefix == "" {
		o.Prefix = "p2p"
	}
	if o.Channels <= 0 {
		o.Channels = DefaultChannels
	}
	o.Channels = min(o.Channels, MaxChannels)
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = DefaultHeartbeat
	}
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = inter.DefaultHandshakeTimeout
	}
	ip := o.ListenIP
	if ip == "" {
		if o.IfName == "" && o.MasterAddr == "" {
			ip = "127.0.0.1"
		} else {
			var err error
			if ip, err = netaddr.ListenIP(o.IfName, o.MasterAddr, !netaddr.IsLoopback(o.MasterAddr)); err != nil {
				return nil, &OpError{Op: "new", Err: fmt.Errorf("%w: %w", ErrInvalid, err)}
			}
		}
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return nil, opErr("new", "", "", ErrInvalid, "listen on %s: %v", ip, err)
	}
	var first [8]byte
	rand.Read(first[:])
	e := &Endpoint{opts: o, key: auth.NewKey(o.Auth.Secret, o.Auth.Job), ln: ln.(*net.TCPListener), addr: ln.Addr().String(),
		host: machine.PIDSpace(), done: make(chan struct{}), closed: make(chan struct{}), regs: map[uint64]*Region{}, names: map[string]struct{}{}, peers: map[string]*Peer{},
		immGen: make(chan struct{}), imms: make(map[*immQueue]struct{}), next: binary.LittleEndian.Uint64(first[:])>>16 + 1}
	e.token = new(uint64)
	rand.Read(first[:])
	*e.token = binary.LittleEndian.Uint64(first[:]) | 1
	openTokens.Store(*e.token, struct{}{})
	e.wg.Add(1)
	go e.acceptLoop()
	return e, nil
}

// made reports whether e came from New: the calls of a zero or nil
// Endpoint fail with ErrInvalid (errZeroEndpoint), not a panic.
func (e *Endpoint) made() bool { return e != nil && e.done != nil }

// errZeroEndpoint is the error of a call on an Endpoint that made says is
// not one.
func errZeroEndpoint(op string) error {
	return opErr(op, "", "", ErrInvalid, "an Endpoint not made by New")
}

// Name is the endpoint's name.
func (e *Endpoint) Name() string { return e.opts.Name }

// Addr is the address the endpoint listens on.
func (e *Endpoint) Addr() string { return e.addr }

// Refused counts the requests this endpoint refused as a target.
func (e *Endpoint) Refused() int64 { return e.refused.Load() }

// Region is registered memory: peers read and write it by its id and key
// (RemoteRegion). Its memory must stay valid until Deregister returns.
type Region struct {
	e    *Endpoint
	name string
	id   uint64
	key  uint64
	buf  []byte             // host memory, or
	dev  *device.CUDABuffer // GPU memory
	sh   *Shared            // buf's Shared memory, if it is one
	size int
	mu   sync.Mutex
	refs int // requests served on it now (as a target)
	// holders counts refs by the peer whose request took them, so that a
	// Deregister or Close that gives up can say which peers hold it.
	holders map[*Peer]int
	// users are this side's transfers that read or write it.
	users   map[*part]struct{}
	closed  atomic.Bool
	drained chan struct{} // closed when closed and refs reaches 0
}

// RemoteRegion is what a peer needs to address a region: its id, its key
// and its size. Hand it over in an Info (Publish, Peer.Remote) or out of
// band (MarshalBinary).
type RemoteRegion struct {
	Name string
	ID   uint64
	Key  uint64
	Size uint64
}

// MarshalBinary encodes r in 24 bytes plus the name.
func (r RemoteRegion) MarshalBinary() ([]byte, error) {
	b := binary.LittleEndian.AppendUint64(nil, r.ID)
	b = binary.LittleEndian.AppendUint64(b, r.Key)
	b = binary.LittleEndian.AppendUint64(b, r.Size)
	return append(b, r.Name...), nil
}

// UnmarshalBinary decodes what MarshalBinary made.
func (r *RemoteRegion) UnmarshalBinary(b []byte) error {
	if len(b) < 24 || len(b)-24 > MaxName {
		return fmt.Errorf("%w: a remote region is 24 bytes and a name", ErrInvalid)
	}
	n := RemoteRegion{ID: binary.LittleEndian.Uint64(b), Key: binary.LittleEndian.Uint64(b[8:]), Size: binary.LittleEndian.Uint64(b[16:]), Name: string(b[24:])}
	if err := validName(n.Name); err != nil {
		return err
	}
	if n.Size == 0 || n.Size > MaxLen {
		return fmt.Errorf("%w: remote region size %d", ErrInvalid, n.Size)
	}
	*r = n
	return nil
}

// Name is the region's name.
func (r *Region) Name() string { return r.name }

// Bytes is the region's memory (nil for GPU memory).
func (r *Region) Bytes() []byte { return r.buf }

// seg is the region's memory whole.
func (r *Region) seg() seg {
	if r.dev != nil {
		return seg{d: r.dev, n: r.size}
	}
	return seg{b: r.buf, n: len(r.buf), sh: r.sh}
}

// idle says nothing touches r's memory any more, nor will: it was
// deregistered (or its endpoint closed, which withdraws it) and no peer's
// request uses it.
func (r *Region) idle() bool {
	if !r.closed.Load() {
		return false
	}
	select {
	case <-r.drained:
		return true
	default:
		return false
	}
}

// Remote is what a peer needs to address the region.
func (r *Region) Remote() RemoteRegion {
	return RemoteRegion{Name: r.name, ID: r.id, Key: r.key, Size: uint64(r.size)}
}

func (r *Region) label() string { return fmt.Sprintf("%q", r.name) }

// labelOrNil is label, for a Region that may be nil or not made by
// Register (an argument's, for its error).
func (r *Region) labelOrNil() string {
	if r == nil || r.e == nil {
		return ""
	}
	return r.label()
}

// whose says what r is, for an error about a Region that is not the
// endpoint's: nil, not made by Register, or whose.
func (r *Region) whose() string {
	switch {
	case r == nil:
		return "a nil region"
	case r.e == nil:
		return "a Region not made by Register"
	}
	return fmt.Sprintf("region %q of endpoint %q", r.name, r.e.opts.Name)
}

// Register makes mem readable and writable by the endpoint's peers and
// returns its Region, with a fresh random 64-bit key that a request must
// carry. mem is a []byte, a *Shared (which a peer on the same host maps
// and copies itself), a device.Buffer of host memory
// (*device.HostBuffer, symmetric or not), or GPU memory
// (*device.CUDABuffer), which a peer on the same host whose own memory is
// GPU memory copies device to device through CUDA IPC, and transfers
// elsewhere stage through host memory a chunk at a time, over TCP.
// A name is one region's at a time: Register refuses (ErrInvalid) a name
// registered and not yet deregistered at this endpoint. Registration
// costs two map inserts; it pins nothing (Go's heap does not move).
func (e *Endpoint) Register(name string, mem any) (*Region, error) {
	if !e.made() {
		return nil, errZeroEndpoint("register")
	}
	if err := validName(name); err != nil {
		// The name clipped and quoted, as validName's text has it: a
		// name of any length or bytes makes an error of one short line.
		return nil, &OpError{Op: "register", Region: fmt.Sprintf("%.32q", name), Err: err}
	}
	q := strconv.Quote(name) // OpError.Region, quoted as every error of the package has it
	if v := reflect.ValueOf(mem); v.Kind() == reflect.Pointer && v.IsNil() {
		// A nil *Shared, *device.HostBuffer or *device.CUDABuffer: no
		// memory to ask its size or bytes of.
		return nil, opErr("register", "", q, ErrInvalid, "a nil %T", mem)
	}
	var buf []byte
	var dev *device.CUDABuffer
	var sh *Shared
	size := 0
	switch m := mem.(type) {
	case []byte:
		buf = m
	case *Shared:
		sh, buf = m, m.Bytes()
		if buf == nil {
			return nil, opErr("register", "", q, ErrInvalid, "the shared memory is closed")
		}
	case interface{ Bytes() []byte }:
		buf = m.Bytes()
	case *device.CUDABuffer:
		dev, size = m, m.Len
	case device.Buffer:
		return nil, opErr("register", "", q, ErrInvalid, "memory of kind %v: only host memory can be registered yet", m.Kind())
	default:
		return nil, opErr("register", "", q, ErrInvalid, "memory of type %T", mem)
	}
	if dev == nil {
		size = len(buf)
	}
	if size == 0 || uint64(size) > MaxLen {
		return nil, opErr("register", "", q, ErrInvalid, "%d bytes", size)
	}
	var k [8]byte
	rand.Read(k[:])
	r := &Region{e: e, name: name, key: binary.LittleEndian.Uint64(k[:]), buf: buf, dev: dev, sh: sh, size: size, users: map[*part]struct{}{}, drained: make(chan struct{})}
	if sh != nil {
		if err := sh.attach(r); err != nil {
			return nil, err
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.shut {
		if sh != nil {
			sh.detach(r)
		}
		return nil, opErr("register", "", q, ErrClosed, "the endpoint is closed")
	}
	n := len(e.names)
	e.names[name] = struct{}{} // one hash of the name: it is new if the map grew
	if len(e.names) == n {
		if sh != nil {
			sh.detach(r)
		}
		return nil, opErr("register", "", q, ErrInvalid, "a region of this name is registered (Deregister it first)")
	}
	r.id = e.next
	e.next++
	e.regs[r.id] = r
	return r, nil
}

// Deregister withdraws r: new requests for it are refused at once
// (ErrRefused on the peer's side), this side's transfers that use it fail
// with ErrClosed, and requests being served on it stop at their next chunk
// and fail on the peer's side. It returns when nothing touches r's memory
// any more, or with ErrTimeout when ctx's deadline (or Options.Timeout)
// passes first, ErrCancelled when ctx is cancelled first, in which case
// r's memory must not be reused.
func (e *Endpoint) Deregister(ctx context.Context, r *Region) error {
	if !e.made() {
		return errZeroEndpoint("deregister")
	}
	if r == nil || r.e != e {
		return opErr("deregister", "", r.labelOrNil(), ErrInvalid, "not a region of this endpoint (%q): %s", e.opts.Name, r.whose())
	}
	held := e.withdraw(r, "deregistered")
	ctx, cancel := e.bound(ctx)
	defer cancel()
	for _, p := range held {
		if !doneFirst(p.f.done, ctx.Done()) {
			return opErr("deregister", p.f.peer, r.label(), ended(ctx), "this endpoint's %s from the peer is held up in the kernel by the peer's memory (a same-host copy whose pages do not come)", p.f.op)
		}
	}
	if !doneFirst(r.drained, ctx.Done()) {
		peer, who := r.holding()
		return opErr("deregister", peer, r.label(), ended(ctx), "%s still uses it", who)
	}
	return nil
}

// doneFirst waits for ch to close or stop to fire (a context's Done, a
// timer's C), and reports whether ch closed. A ch already closed wins over
// a stop already fired: a select of both would pick one at random, and
// fail a wait that had nothing left to wait for.
func doneFirst[T any](ch <-chan struct{}, stop <-chan T) bool {
	select {
	case <-ch:
		return true
	default:
	}
	select {
	case <-ch:
		return true
	case <-stop:
		return false
	}
}

// withdraw is Deregister up to its wait: r is refused to new requests,
// this side's transfers on it fail, and the peers' leases of it are
// revoked; r.drained closes once the peers' requests let go of its memory,
// and this side's transfers have once their parts in held (those whose
// same-host copy was in the kernel: part.finish) are done. how ("was
// deregistered") goes into the transfers' errors.
func (e *Endpoint) withdraw(r *Region, how string) (held []*part) {
	e.mu.Lock()
	if e.regs[r.id] == r { // not withdrawn before: the name is r's
		delete(e.regs, r.id)
		delete(e.names, r.name)
	}
	e.mu.Unlock()
	r.mu.Lock()
	first := !r.closed.Swap(true)
	users := make([]*part, 0, len(r.users))
	for p := range r.users {
		users = append(users, p)
	}
	if first && r.refs == 0 {
		close(r.drained)
	}
	r.mu.Unlock()
	for _, p := range users {
		// The error names the transfer's region (the peer's), as every
		// other error of the transfer does, and this side's in its text.
		if p.finish(opErr(p.f.op, p.f.peer, p.f.label(), ErrClosed, "this side's region %s was %s during the transfer", r.label(), how)) {
			held = append(held, p)
		}
	}
	if first {
		e.revokeLeases(r)
	}
	return held
}

// bound is ctx, bounded by Options.Timeout when it has no deadline.
func (e *Endpoint) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, e.opts.Timeout)
}

// holding names the peers whose requests hold r now: peer is the first
// of their names in order ("" when none does), who says whose requests
// they are, for an error's text.
func (r *Region) holding() (peer, who string) {
	r.mu.Lock()
	names := make([]string, 0, len(r.holders))
	for p := range r.holders {
		names = append(names, p.name)
	}
	r.mu.Unlock()
	slices.Sort(names)
	names = slices.Compact(names)
	switch len(names) {
	case 0:
		return "", "a peer's request"
	case 1:
		return names[0], "a request of the peer"
	}
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = strconv.Quote(n)
	}
	return names[0], "requests of peers " + strings.Join(quoted, ", ")
}

// acquire checks the descriptors of a request of peer p as its target: every region
// registered and not deregistered, every key right (compared in constant
// time), every range inside its region. On success it takes a reference on
// each region the ranges lie in, once per run of descriptors in one region
// (released by release: regs holds each run's region once, so that a batch
// of many pages of one region costs one reference, not one per page), and
// returns the memory of each range; on failure it takes nothing and says
// why.
func (e *Endpoint) acquire(p *Peer, ds []desc, segs []seg, regs []*Region) ([]seg, []*Region, uint8, string) {
	segs, regs = segs[:0], regs[:0]
	e.mu.Lock()
	defer e.mu.Unlock()
	var r *Region
	for i, d := range ds {
		// A descriptor of the region and key of the one before it was
		// checked with it: the same region, and the same key, which
		// matched (both the peer's; comparing them reveals nothing of
		// the region's key).
		if i == 0 || d.region != ds[i-1].region || d.key != ds[i-1].key {
			r = e.regs[d.region]
			var k [8]byte
			binary.LittleEndian.PutUint64(k[:], d.key)
			var rk [8]byte
			if r != nil {
				binary.LittleEndian.PutUint64(rk[:], r.key)
			}
			switch {
			case e.shut:
				// Close deregisters every region: the peer is told the
				// endpoint is going, not that it named no region.
				return segs, regs[:0], stClosing, fmt.Sprintf("descriptor %d: the endpoint is closing", i)
			case r == nil || r.closed.Load():
				return segs, regs[:0], stNoRegion, fmt.Sprintf("descriptor %d: region id %d", i, d.region)
			case subtle.ConstantTimeCompare(k[:], rk[:]) != 1:
				return segs, regs[:0], stKey, fmt.Sprintf("descriptor %d: region %s: a wrong key", i, r.label())
			}
			if len(regs) == 0 || regs[len(regs)-1] != r {
				regs = append(regs, r)
			}
		}
		if d.off > uint64(r.size) || d.len > uint64(r.size)-d.off {
			return segs, regs[:0], stBounds, fmt.Sprintf("descriptor %d: region %s: bytes %d to %d of %d", i, r.label(), d.off, d.off+d.len, r.size)
		}
		segs = append(segs, r.seg().sub(int(d.off), int(d.len)))
	}
	for _, r := range regs {
		r.mu.Lock()
		r.refs++
		if r.holders == nil {
			r.holders = make(map[*Peer]int)
		}
		r.holders[p]++
		r.mu.Unlock()
	}
	return segs, regs, stOK, ""
}

// release drops the references acquire took on regs for peer p.
func (e *Endpoint) release(p *Peer, regs []*Region) {
	for _, r := range regs {
		r.mu.Lock()
		r.refs--
		if r.holders[p]--; r.holders[p] <= 0 {
			delete(r.holders, p)
		}
		if r.refs == 0 && r.closed.Load() {
			select {
			case <-r.drained:
			default:
				close(r.drained)
			}
		}
		r.mu.Unlock()
	}
}

// refuse records a refusal as a target (none where the endpoint is
// closing: the peer did nothing wrong).
func (e *Endpoint) refuse(peer, op string, st uint8, detail string) {
	if st == stClosing {
		return
	}
	e.refused.Add(1)
	if e.opts.OnRefuse != nil {
		e.opts.OnRefuse(opErr("serve "+op, peer, "", ErrRefused, "%s: %s", statusText[st], detail))
	}
}

// goneStatus is the status of a transfer whose region was deregistered
// during it: stClosing where the endpoint is closing (Close deregisters
// every region), else stNoRegion.
func (e *Endpoint) goneStatus() uint8 {
	select {
	case <-e.done:
		return stClosing
	default:
		return stNoRegion
	}
}

// idHeap is a max-heap of regions by id (container/heap).
type idHeap []*Region

func (h idHeap) Len() int           { return len(h) }
func (h idHeap) Less(i, j int) bool { return h[i].id > h[j].id }
func (h idHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *idHeap) Push(x any)        { *h = append(*h, x.(*Region)) }
func (h *idHeap) Pop() any          { old := *h; r := old[len(old)-1]; *h = old[:len(old)-1]; return r }

// Info is the endpoint's description for out-of-band exchange: its name,
// address, host and the regions registered now, the first MaxInfoRegions
// registered where there are more (hand the others' Region.Remote to the
// peer yourself). A peer passes it to ConnectInfo.
func (e *Endpoint) Info() []byte {
	if !e.made() {
		return nil
	}
	in := info{name: e.opts.Name, addr: e.addr, host: e.host, pid: uint32(os.Getpid()),
		token: *e.token, tokenAddr: uint64(uintptr(unsafe.Pointer(e.token)))}
	// The first registered (the lowest ids), in order: the same list
	// every time. A max-heap of ids keeps the lowest MaxInfoRegions seen,
	// so that the walk under e.mu allocates nothing beyond them.
	h := make(idHeap, 0, MaxInfoRegions)
	e.mu.Lock()
	for id, r := range e.regs { // the key is r.id: compared without touching r
		if len(h) < MaxInfoRegions {
			heap.Push(&h, r)
		} else if id < h[0].id {
			h[0] = r
			heap.Fix(&h, 0)
		}
	}
	for _, r := range h {
		in.regions = append(in.regions, r.Remote())
	}
	e.mu.Unlock()
	slices.SortFunc(in.regions, func(a, b RemoteRegion) int { return cmp.Compare(a.ID, b.ID) })
	return in.encode()
}

func (e *Endpoint) infoKey(name string) string { return e.opts.Prefix + "/info/" + name }

// Publish puts Info in the store, where Connect finds it. Publish again
// after registering regions that peers should find by name. A name is
// the first publisher's: where another endpoint's Info holds it already
// (two processes given one name, or an Info left by an earlier run under
// the same Prefix), Publish fails with ErrInvalid naming that endpoint,
// and the store keeps the other's Info; a fresh Prefix per run
// (Options.Prefix from collective's Options.StoreKey), or per endpoint,
// avoids the last. Close leaves its Info, but an Info whose endpoint is
// provably gone no longer holds the name, and Publish replaces it: on
// this host, one whose process has exited (a worker restarted under its
// name) or an endpoint of this process that was closed. An Info from
// another host holds its name until it is deleted from the store.
func (e *Endpoint) Publish(ctx context.Context) error {
	if !e.made() {
		return errZeroEndpoint("publish")
	}
	if e.opts.Store == nil {
		return opErr("publish", "", "", ErrInvalid, "no store in Options")
	}
	e.mu.Lock()
	shut := e.shut
	e.mu.Unlock()
	if shut {
		return opErr("publish", "", "", ErrClosed, "the endpoint is closed")
	}
	ctx, cancel := e.bound(ctx)
	defer cancel()
	mine, key := e.Info(), e.infoKey(e.opts.Name)
	var old []byte // absent
	for {
		cur, ok, err := e.opts.Store.CompareAndSet(ctx, key, old, mine)
		if err != nil {
			if spent(ctx) || errors.Is(err, rendezvous.ErrTimeout) { // as Connect's
				return opErr("publish", "", "", ended(ctx), "the store: %v", err)
			}
			return opErr("publish", "", "", ErrPeerLost, "the store: %v", err)
		}
		if ok {
			return nil
		}
		if len(cur) == 0 { // gone meanwhile (deleted): set it where absent
			old = nil
			continue
		}
		in, err := decodeInfo(cur)
		if err != nil {
			return opErr("publish", "", "", ErrInvalid, "the name %q is taken in the store by something else than an endpoint's info (%v)", e.opts.Name, err)
		}
		if in.token != *e.token || in.host != e.host || in.pid != uint32(os.Getpid()) {
			if !e.gone(in) {
				return opErr("publish", "", "", ErrInvalid, "the name %q is taken by another endpoint (pid %d, listening at %s)", e.opts.Name, in.pid, in.addr)
			}
			old = cur // a gone endpoint's Info: take the name over (once: a concurrent taker's Info is an open one's)
			continue
		}
		if bytes.Equal(cur, mine) {
			return nil
		}
		old = cur // this endpoint's earlier Info: replace it (again, if a concurrent Publish changed it meanwhile)
	}
}

// gone reports whether the endpoint of in is provably gone, so that its
// Info no longer holds its name: it was on this host (boot and pid
// namespace) and its process has exited, or it was an endpoint of this
// process that has been closed. An endpoint elsewhere cannot be told
// gone (a refused dial may be a firewall's), nor a pid that runs again
// (reused): those keep the name.
func (e *Endpoint) gone(in info) bool {
	if !machine.SamePIDSpace(in.host, e.host) || in.pid == 0 {
		return false
	}
	if in.pid != uint32(os.Getpid()) {
		return !machine.Alive(int(in.pid))
	}
	_, open := openTokens.Load(in.token)
	return !open
}

// openTokens holds the tokens of this process's endpoints that are not
// closed (Publish takes over the name of one that is: gone).
var openTokens sync.Map

// Connect returns the link to the endpoint named name, waiting in the
// store for its Info (bounded by ctx, or Options.Timeout: ErrTimeout when
// the deadline passes, ErrCancelled when ctx is cancelled) and connecting
// when there is no link yet. Both ends may call it, at once or not: there
// is one link per pair, and either side may start any operation on it.
// Several Connects to one peer at once share one dial, and each ends at
// its own context: one whose dialing Connect ended first dials again.
// An Info whose address refuses connections fails it at once: with
// ErrPeerLost where the peer was on this host and its process has exited,
// else with ErrRefused. Close ends a Connect still waiting for the Info
// (ErrClosed). A Connect cancelled or closed while it waits leaves the
// store client usable.
func (e *Endpoint) Connect(ctx context.Context, name string) (*Peer, error) {
	if !e.made() {
		return nil, errZeroEndpoint("connect")
	}
	if e.opts.Store == nil {
		return nil, opErr("connect", name, "", ErrInvalid, "no store in Options: use ConnectInfo")
	}
	if name == "" {
		return nil, opErr("connect", "", "", ErrInvalid, "an empty peer name")
	}
	if err := validName(name); err != nil {
		// The name clipped (validName's text quotes its start): a name
		// of any length makes an error of one short line.
		return nil, &OpError{Op: "connect", Peer: clip(name, 32), Err: err}
	}
	ctx, cancel := e.bound(ctx)
	defer cancel()
	start := time.Now()
	v, err := e.waitInfo(ctx, e.infoKey(name))
	if err != nil {
		if errors.Is(err, ErrClosed) {
			return nil, opErr("connect", name, "", ErrClosed, "the endpoint was closed before the peer's info came")
		}
		// The store's own timeout, not ctx.Err alone: the store ends a
		// wait at ctx's deadline by its own clock (in whole
		// milliseconds), before ctx's timer fires (ErrTimeout, not
		// ErrPeerLost).
		if spent(ctx) || errors.Is(err, rendezvous.ErrTimeout) {
			return nil, opErr("connect", name, "", ended(ctx), "it never published its info (waited %v): %v", time.Since(start).Round(time.Millisecond), err)
		}
		return nil, opErr("connect", name, "", ErrPeerLost, "the store: %v", err)
	}
	if in, err := decodeInfo(v); err == nil && in.name != name {
		return nil, opErr("connect", name, "", ErrInvalid, "the info stored under %q is endpoint %q's", name, in.name)
	}
	return e.ConnectInfo(ctx, v)
}

// infoSlice bounds one store wait of waitInfo: how late a Connect
// waiting for an Info sees its context cancelled or its endpoint closed.
const infoSlice = 250 * time.Millisecond

// waitInfo gets key from the store, waiting for it until ctx's deadline
// (bound sets one), in store waits of at most infoSlice that end by their
// deadline alone: a store call cancelled mid-call gives the client's
// connection up for good (the program's later calls on it fail), so
// ctx's cancellation, and Close (ErrClosed), are seen between slices.
func (e *Endpoint) waitInfo(ctx context.Context, key string) ([]byte, error) {
	dl, _ := ctx.Deadline()
	for {
		select {
		case <-e.done:
			return nil, ErrClosed
		default:
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		sdl := time.Now().Add(infoSlice)
		if dl.Before(sdl) {
			sdl = dl
		}
		sctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), sdl)
		v, err := e.opts.Store.Get(sctx, key)
		cancel()
		if err == nil || !errors.Is(err, rendezvous.ErrTimeout) || !time.Now().Before(dl) {
			return v, err
		}
	}
}

// ConnectInfo is Connect with the peer's Info handed over out of band.
// Nothing in it is trusted: it is parsed strictly, and its address must be
// a literal ip:port.
func (e *Endpoint) ConnectInfo(ctx context.Context, infoBytes []byte) (*Peer, error) {
	if !e.made() {
		return nil, errZeroEndpoint("connect")
	}
	in, err := decodeInfo(infoBytes)
	if err != nil {
		return nil, &OpError{Op: "connect", Err: err}
	}
	if in.name == e.opts.Name {
		return nil, opErr("connect", in.name, "", ErrInvalid, "that is this endpoint's own name")
	}
	ctx, cancel := e.bound(ctx)
	defer cancel()
	for {
		p, again, err := e.connect(ctx, in)
		if !again {
			return p, err
		}
	}
}

// connect is one try of ConnectInfo: it dials, or waits for the link that
// another Connect dials or the peer makes. again reports that the
// Connect which dialed ended by its own context (not by the peer), while
// ctx is live: ConnectInfo tries again, and may dial itself.
func (e *Endpoint) connect(ctx context.Context, in info) (_ *Peer, again bool, _ error) {
	e.mu.Lock()
	if e.shut {
		e.mu.Unlock()
		return nil, false, opErr("connect", in.name, "", ErrClosed, "the endpoint is closed")
	}
	p := e.peers[in.name]
	dial := p == nil
	if dial {
		p = newPeer(e, in.name)
		p.dialing = true
		e.peers[in.name] = p
	}
	p.setInfo(in)
	e.mu.Unlock()
	dup := false
	for {
		if dial {
			err := e.dial(ctx, p, in)
			if err != nil && !errors.Is(err, errDup) {
				cut := spent(ctx)
				if cut && dup { // a dial again, cut by the deadline
					err = opErr("connect", in.name, "", ended(ctx), "%s", dupWhy)
				}
				e.dropPeerCut(p, err, cut)
				return nil, false, err
			}
			dup = dup || err != nil
		}
		// The peer answered that it makes the link itself (or has one):
		// its connections come to the accept loop. If its own dial
		// failed, or its old link has not yet noticed that this side's
		// ended, they never come: ask again after a while.
		retry := make(<-chan time.Time)
		if dup {
			retry = time.After(dupRetry)
		}
		select {
		case <-p.ready:
			if p.err != nil {
				// The dialing Connect's context ended, not the peer:
				// this one's deadline is its own.
				return nil, p.cut && !dial && ctx.Err() == nil, p.err
			}
			p.l.enableCMA(in)
			return p, false, nil
		case <-retry:
			continue
		case <-ctx.Done():
			why := "the link was not made in time"
			if dup {
				why = dupWhy
			}
			err := opErr("connect", in.name, "", ended(ctx), "%s", why)
			if dial {
				// Only the Connect that dials gives the peer up: another
				// waiting for its link ends alone, at its own deadline.
				e.dropPeerCut(p, err, true)
			}
			return nil, false, err
		}
	}
}

// spent reports whether ctx has ended or its deadline has passed: a
// socket's deadline, set from ctx's, may fire before ctx's own timer.
func spent(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// refusedDial is Connect's error where the peer's Info's address refuses
// connections: ErrPeerLost where the peer is on this host and its process
// has exited; else ErrRefused, with what may cause it (its endpoint
// closed, an Info left by an earlier run, another network namespace, a
// firewall).
func (e *Endpoint) refusedDial(in info, addr string) error {
	if machine.SamePIDSpace(in.host, e.host) && in.pid != 0 {
		if !machine.Alive(int(in.pid)) {
			return opErr("connect", in.name, "", ErrPeerLost, "dial %s: its process (pid %d) has exited", addr, in.pid)
		}
		return opErr("connect", in.name, "", ErrRefused, "dial %s: connection refused, though its process (pid %d) runs: its endpoint was closed, or the address is out of reach from here (another network namespace, a firewall)", addr, in.pid)
	}
	return opErr("connect", in.name, "", ErrRefused, "dial %s: connection refused: its endpoint was closed or its process exited (the Info may be an earlier run's), or a firewall refuses it", addr)
}

// dupRetry is how long Connect waits for a peer's link after the peer
// answered that it makes the link itself, before it dials again.
const dupRetry = time.Second

const dupWhy = "the peer answered that it makes the link itself (its name is lower, or it has a link to this endpoint), and its connections never arrived"

// dropPeer forgets p if it is not linked yet, failing its waiters.
func (e *Endpoint) dropPeer(p *Peer, err error) { e.dropPeerCut(p, err, false) }

// dropPeerCut is dropPeer by the dialing Connect; cut says that its own
// context ended it (p.cut, set with p.err, under e.mu, before p.ready
// closes).
func (e *Endpoint) dropPeerCut(p *Peer, err error, cut bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if p.l == nil && p.err == nil {
		p.err, p.cut = err, cut
		close(p.ready)
	}
	if e.peers[p.name] == p && p.l == nil {
		delete(e.peers, p.name)
	}
}

var errDup = errors.New("p2p: the peer links to this endpoint itself")

// maxGrants bounds the same-host grants a peer holds (asked for and not
// yet released), and maxGrantRefs the region references they hold (one
// per run of a grant's ranges in one region: acquire).
var maxGrants, maxGrantRefs = 1 << 16, 1 << 20

// maxQueued bounds the answers (frames the peer's frames caused:
// isAnswer) waiting for one connection's writer: a peer that sends frames
// and does not read what they cause has its link closed (enqueue). What
// this side starts (requests, sends, cancels) does not count.
var maxQueued = 1 << 18

// maxHandshakes bounds the connections whose handshake (internal/auth and
// the hello) runs at once: past it the accept loop waits, and the kernel's
// backlog holds further connections, so that connections that never
// prove themselves (anyone who reaches the port can open them) hold at
// most this many descriptors and goroutines, each for HandshakeTimeout;
// and never more than three quarters of the descriptors the process may
// open (machine.DescriptorShare): the rest of it needs the others (its links, the
// collectives' transport and shared memory).
var maxHandshakes = 4096

// maxParked bounds the connections that wait in sessions not yet
// complete (a hello came for some of a session's channels, not all),
// counting each such session's channels in full: a hello that would open
// a session past it is refused, so that a member's hellos of ever new
// sessions hold at most this many descriptors (each for 2
// HandshakeTimeouts at most).
var maxParked = 4096

// evictAfter is how long a connection must have been in its handshake
// before a full accept loop closes it to make room (inter.EvictAfter, the
// store's evictAge): far longer than a member's round trip.
var evictAfter = inter.EvictAfter

// dial makes the link's connections to in.addr: each dialed, proven
// (internal/auth) and introduced by a hello naming this endpoint, the
// channel and a session id.
func (e *Endpoint) dial(ctx context.Context, p *Peer, in info) error {
	addr, err := inter.ParseAddr(in.addr)
	if err != nil {
		return opErr("connect", in.name, "", ErrInvalid, "%v", err)
	}
	var s [8]byte
	rand.Read(s[:])
	session := binary.LittleEndian.Uint64(s[:])
	n := e.opts.Channels
	conns := make([]*net.TCPConn, 0, n)
	closeAll := func() {
		for _, c := range conns {
			c.Close()
		}
	}
	d := net.Dialer{Timeout: time.Second}
	var peerHB uint64
	for ch := range n {
		var c net.Conn
		for wait := 10 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
			c, err = d.DialContext(ctx, "tcp", addr)
			if err == nil || ctx.Err() != nil {
				break
			}
			if errors.Is(err, syscall.ECONNREFUSED) {
				// The Info's listener existed before the Info did: it is
				// gone (or out of reach from here), and dialing again
				// will not bring it back.
				closeAll()
				return e.refusedDial(in, addr)
			}
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
		}
		if err != nil {
			closeAll()
			return opErr("connect", in.name, "", ended(ctx), "dial %s: %v", addr, err)
		}
		tc := c.(*net.TCPConn)
		conns = append(conns, tc)
		dl := time.Now().Add(e.opts.HandshakeTimeout)
		if d, ok := ctx.Deadline(); ok && d.Before(dl) {
			dl = d
		}
		// The handshake waits on the socket's deadline alone: a cancel of
		// ctx (which has no deadline of its own) cuts it short at once by
		// closing the socket (a past deadline would not do: the handshake
		// sets and clears deadlines of its own).
		stop := context.AfterFunc(ctx, func() { tc.Close() })
		// failed is the error of a step of the handshake that failed
		// with err: sentinel, unless ctx ended meanwhile or the peer
		// said nothing within the deadline (a process stopped or stuck,
		// whose kernel still accepts its connections).
		failed := func(sentinel, err error, format string, args ...any) error {
			stop()
			closeAll()
			if ctx.Err() != nil {
				sentinel = ended(ctx)
			} else if errors.Is(err, os.ErrDeadlineExceeded) {
				sentinel = ErrTimeout
			}
			return opErr("connect", in.name, "", sentinel, format, args...)
		}
		if err := auth.Connect(tc, e.key, shakePurpose(in.name, in.addr), dl); err != nil {
			if errors.Is(err, auth.ErrNotUser) {
				return failed(ErrRefused, err, "%s: %v", addr, err)
			}
			if errors.Is(err, auth.ErrRefused) {
				return failed(ErrRefused, err, "%s does not prove to be endpoint %q of this job: another endpoint's than %q listens there (the Info is stale), or a process of another job or secret: %v", addr, in.name, in.name, err)
			}
			return failed(ErrRefused, err, "%s: %v", addr, err)
		}
		h := header{kind: kHello, id: session, a: uint64(ch), b: uint32(n), payload: uint32(helloFixed + len(e.opts.Name))}
		var b [HeaderSize + helloFixed + MaxName]byte
		h.put(b[:])
		binary.LittleEndian.PutUint32(b[HeaderSize:], heartbeatMS(e.opts.Heartbeat))
		binary.LittleEndian.PutUint32(b[HeaderSize+4:], uint32(os.Getpid()))
		copy(b[HeaderSize+helloFixed:], e.opts.Name)
		tc.SetDeadline(dl)
		if _, err := tc.Write(b[:HeaderSize+helloFixed+len(e.opts.Name)]); err != nil {
			return failed(ErrPeerLost, err, "hello to %s: %v", addr, err)
		}
		if _, err := readFull(tc, b[:HeaderSize]); err != nil {
			return failed(ErrPeerLost, err, "hello's answer from %s: %v", addr, err)
		}
		if !stop() { // ctx ended as the answer came: its deadline may be set
			closeAll()
			return opErr("connect", in.name, "", ended(ctx), "%s: the handshake was cut short", addr)
		}
		ah, err := decodeHeader(b[:HeaderSize])
		if err == nil && ah.kind != kHelloAck {
			err = fmt.Errorf("%w: kind %d, want a hello's answer", ErrFrame, ah.kind)
		}
		if err != nil {
			closeAll()
			return opErr("connect", in.name, "", ErrRefused, "%s: %v", addr, err)
		}
		if ah.id != 0 && ah.id != nameTag(in.name) {
			// Another endpoint listens at the Info's address (an Info left
			// by an endpoint closed, whose port a later one got; an Info
			// mixed up): a link to it would carry this side's transfers
			// for in.name to that one.
			closeAll()
			return opErr("connect", in.name, "", ErrRefused, "%s is another endpoint's than %q (the Info is stale: its endpoint was closed, and another listens there now)", addr, in.name)
		}
		peerHB = ah.a
		switch ah.status {
		case stDup:
			closeAll()
			return errDup
		case stRefusedHello:
			closeAll()
			return opErr("connect", in.name, "", ErrRefused, "%s refused the link", addr)
		}
		tc.SetDeadline(time.Time{})
	}
	if err := e.install(p, conns, in.pid, in.pid == uint32(os.Getpid()) && machine.SamePIDSpace(in.host, e.host), peerHB); err != nil {
		closeAll()
		return err
	}
	return nil
}

// readFull is io.ReadFull on a net.Conn.
func readFull(c net.Conn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := c.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// install makes a link of conns for p, whose process says it is pid, and
// starts its goroutines; if p already has one (the peer's own dial won),
// conns are surplus.
func (e *Endpoint) install(p *Peer, conns []*net.TCPConn, pid uint32, self bool, peerHB uint64) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.shut {
		return opErr("connect", p.name, "", ErrClosed, "the endpoint is closed")
	}
	if p.l != nil {
		return errDup
	}
	if p.err != nil {
		return p.err
	}
	hb := e.opts.Heartbeat
	if peerHB > 0 {
		hb = min(hb, time.Duration(peerHB)*time.Millisecond)
	}
	// A peer that proposes none (0 ms, which no honest one sends) does
	// not lift the floor: a heartbeat of a few nanoseconds would stop
	// the pings (a ticker of a quarter of it panics).
	hb = max(hb, minHeartbeat)
	p.l = newLink(e, p, conns, hb)
	p.l.peerPid = pid
	// A peer in this process answers on this process's processors, which
	// a Wait's ppoll would hold: its Waits park (own_linux.go).
	p.l.waitReads = !self || waitReadsSelf
	p.dialing = false
	close(p.ready)
	p.l.start()
	return nil
}

// acceptLoop accepts connections until Close; each one's handshake and
// hello run in a goroutine of their own, bounded by HandshakeTimeout, at
// most maxHandshakes at once.
func (e *Endpoint) acceptLoop() {
	defer e.wg.Done()
	var pendMu sync.Mutex
	pending := map[uint64]*pendingLink{}
	// The channels of sessions about to be pending (roomToPark).
	reserving := map[uint64]int{}
	// Connections in their handshake, since when: with every slot taken,
	// those that have lasted evictAfter are closed to make room, so
	// that connections that never prove anything (anyone who reaches the
	// port can open them) cannot hold the members out for as long as
	// they keep coming; a member's handshake takes a round trip.
	var shakeMu sync.Mutex
	shaking := map[*net.TCPConn]time.Time{}
	defer func() { // Close: the links half accepted go too
		pendMu.Lock()
		for id, pl := range pending {
			pl.close()
			delete(pending, id)
		}
		pendMu.Unlock()
		// And the handshakes under way: their greet fails now rather
		// than hold Close for HandshakeTimeout.
		shakeMu.Lock()
		for c := range shaking {
			c.Close()
			delete(shaking, c)
		}
		shakeMu.Unlock()
	}()
	slots := make(chan struct{}, min(maxHandshakes, machine.DescriptorShare()))
	evict := func() {
		shakeMu.Lock()
		defer shakeMu.Unlock()
		for c, at := range shaking {
			if time.Since(at) >= evictAfter {
				c.Close() // its greet fails and gives its slot back
				delete(shaking, c)
			}
		}
	}
	tick := time.NewTicker(evictAfter / 5)
	defer tick.Stop()
	// A connection in its handshake holds a slot and one of the process's
	// share of descriptors for connections from anyone
	// (machine.TakeUnproven, which the store and the process's other
	// endpoints draw from too), both given back when its greet returns.
	release := func() {
		<-slots
		machine.ReleaseUnproven()
	}
	for {
	wait:
		for {
			select {
			case slots <- struct{}{}:
				if machine.TakeUnproven() {
					break wait
				}
				<-slots
				evict()
				select {
				case <-e.done:
					return
				case <-tick.C:
				}
			case <-e.done:
				return
			case <-tick.C:
				evict()
			}
		}
		c, err := e.ln.AcceptTCP()
		if err != nil {
			release()
			select {
			case <-e.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors (the process's limit is below what a
			// flood of connections holds): the silent ones make room.
			evict()
			time.Sleep(10 * time.Millisecond)
			continue
		}
		shakeMu.Lock()
		shaking[c] = time.Now()
		shakeMu.Unlock()
		proven := func() {
			shakeMu.Lock()
			delete(shaking, c)
			shakeMu.Unlock()
		}
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			defer release()
			defer proven()
			e.greet(c, &pendMu, pending, reserving, proven)
		}()
	}
}

func (pl *pendingLink) close() {
	if pl.timer != nil {
		pl.timer.Stop()
	}
	for _, c := range pl.conns {
		if c != nil {
			c.Close()
		}
	}
}

// pendingLink gathers the connections of a link being accepted.
type pendingLink struct {
	hb    uint64 // the peer's heartbeat, ms
	pid   uint32 // the peer's pid, as its hello says
	name  string
	conns []*net.TCPConn
	n     int
	at    time.Time
	timer *time.Timer // drops the session if it never completes
}

// roomToPark says whether a hello of channel count n for session id may
// be taken, and reserves what it takes (in reserving, which mu guards
// like pending): a session waits with all its channels counted, from its
// first hello on, so that connections in incomplete sessions never exceed
// maxParked. A hello of a session already waiting, or reserved, fits in
// what that session holds, and reserves nothing; one that opens a session
// fits only where its n channels do, and reserves them until its session
// is in pending (unreserve). It returns how many it reserved, or -1 where
// the hello does not fit.
func roomToPark(mu *sync.Mutex, pending map[uint64]*pendingLink, reserving map[uint64]int, id uint64, n int) int {
	mu.Lock()
	defer mu.Unlock()
	if pending[id] != nil || reserving[id] > 0 {
		return 0
	}
	held := 0
	for _, r := range reserving {
		held += r
	}
	for _, q := range pending {
		held += len(q.conns)
	}
	if held+n > maxParked {
		return -1
	}
	reserving[id] = n
	return n
}

// unreserve gives back what roomToPark reserved for session id (res
// channels); mu is held.
func unreserve(reserving map[uint64]int, id uint64, res int) {
	if res > 0 {
		delete(reserving, id)
	}
}

// greet runs the acceptor's side of one connection: the handshake, the
// hello, and, when the hello's session has all its channels, the link.
// proven is called once the connection has passed the handshake and sent
// its hello: from then on it is a member's, and never evicted.
func (e *Endpoint) greet(c *net.TCPConn, mu *sync.Mutex, pending map[uint64]*pendingLink, reserving map[uint64]int, proven func()) {
	dl := time.Now().Add(e.opts.HandshakeTimeout)
	if err := auth.Accept(c, e.key, shakePurpose(e.opts.Name, e.addr), dl); err != nil {
		c.Close()
		return
	}
	c.SetDeadline(dl)
	var b [HeaderSize + helloFixed + MaxName]byte
	if _, err := readFull(c, b[:HeaderSize]); err != nil {
		c.Close()
		return
	}
	h, err := decodeHeader(b[:HeaderSize])
	if err != nil || h.kind != kHello {
		c.Close()
		return
	}
	if _, err := readFull(c, b[HeaderSize:HeaderSize+int(h.payload)]); err != nil {
		c.Close()
		return
	}
	proven()
	peerHB := uint64(binary.LittleEndian.Uint32(b[HeaderSize:]))
	peerPid := binary.LittleEndian.Uint32(b[HeaderSize+4:])
	name := string(b[HeaderSize+helloFixed : HeaderSize+int(h.payload)])
	answer := func(st uint8) bool {
		a := header{kind: kHelloAck, status: st, a: uint64(heartbeatMS(e.opts.Heartbeat)), id: nameTag(e.opts.Name)}
		a.put(b[:])
		_, err := c.Write(b[:HeaderSize])
		return err == nil
	}
	if validName(name) != nil || name == e.opts.Name {
		answer(stRefusedHello)
		c.Close()
		return
	}
	// A link to this peer made, or being made by the lower name, wins.
	e.mu.Lock()
	p := e.peers[name]
	dup := p != nil && (p.l != nil || p.dialing && e.opts.Name < name)
	e.mu.Unlock()
	if dup {
		answer(stDup)
		c.Close()
		return
	}
	res := roomToPark(mu, pending, reserving, h.id, int(h.b))
	if res < 0 {
		answer(stRefusedHello)
		c.Close()
		return
	}
	if !answer(stOK) {
		mu.Lock()
		unreserve(reserving, h.id, res)
		mu.Unlock()
		c.Close()
		return
	}
	c.SetDeadline(time.Time{})
	mu.Lock()
	unreserve(reserving, h.id, res) // the session, in pending below, holds its channels
	pl := pending[h.id]
	if pl == nil {
		pl = &pendingLink{name: name, conns: make([]*net.TCPConn, h.b), at: time.Now(), hb: peerHB, pid: peerPid}
		pending[h.id] = pl
		// A session whose other channels never come (its connector gave
		// up when this end answered "dup" on a later one, or died) is
		// dropped then, its connections closed, as the sweep below does
		// when another hello comes: none may.
		id := h.id
		pl.timer = time.AfterFunc(2*e.opts.HandshakeTimeout, func() {
			mu.Lock()
			defer mu.Unlock()
			if pending[id] == pl {
				pl.close()
				delete(pending, id)
			}
		})
	}
	for id, q := range pending { // forget sessions that never completed
		if time.Since(q.at) > 2*e.opts.HandshakeTimeout {
			q.close()
			delete(pending, id)
		}
	}
	// Every hello of a session must agree on its name and channel count
	// (a hostile member's may not: a channel past the first hello's count
	// would index past the session's connections).
	if pl.name != name || len(pl.conns) != int(h.b) || pl.conns[h.a] != nil {
		mu.Unlock()
		c.Close()
		return
	}
	pl.conns[h.a] = c
	pl.n++
	select {
	case <-e.done: // closed meanwhile (its accept loop may have swept already)
		pl.close()
		delete(pending, h.id)
		mu.Unlock()
		return
	default:
	}
	if pl.n < len(pl.conns) {
		mu.Unlock()
		return
	}
	delete(pending, h.id)
	pl.timer.Stop()
	mu.Unlock()
	e.mu.Lock()
	p = e.peers[name]
	if p == nil || p.l != nil || p.err != nil {
		if p != nil && p.l != nil {
			e.mu.Unlock()
			for _, c := range pl.conns {
				c.Close()
			}
			return
		}
		p = newPeer(e, name)
		e.peers[name] = p
	}
	e.mu.Unlock()
	// An accepted link knows the peer by its connections and its hello
	// alone (its Info, with its host, is in the store or handed over).
	// An acceptor knows the dialer's pid alone: a peer of the same pid in
	// another pid namespace counts as this process (its Waits park, a
	// cost in speed only).
	if err := e.install(p, pl.conns, pl.pid, pl.pid == uint32(os.Getpid()), pl.hb); err != nil {
		for _, c := range pl.conns {
			c.Close()
		}
	}
}

// Peer returns the link to the endpoint named name if one is made (by
// either side), or nil.
func (e *Endpoint) Peer(name string) *Peer {
	if !e.made() {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if p := e.peers[name]; p != nil && p.l != nil {
		return p
	}
	return nil
}

// Imm returns the next immediate a peer's WriteWithImm delivered (in the
// order they arrived), waiting until ctx ends (or Options.Timeout):
// ErrTimeout when the deadline passes, ErrCancelled when ctx is
// cancelled. It waits on however many peers are lost meanwhile; to wait
// for one peer's immediates and learn at once that it is gone, use
// Peer.Imm.
func (e *Endpoint) Imm(ctx context.Context) (Imm, error) {
	if !e.made() {
		return Imm{}, errZeroEndpoint("imm")
	}
	return e.takeImm(ctx, nil)
}

// Imm returns the next immediate this peer's WriteWithImm delivered over
// this link (in the order they arrived; Endpoint.Imm takes from the same
// queue), waiting until ctx ends (or Options.Timeout): ErrTimeout when
// the deadline passes, ErrCancelled when ctx is cancelled. Once the link
// has failed and none of its immediates is left, it fails at once with
// ErrPeerLost naming the peer, and the link's error (a closed connection,
// a heartbeat's silence) as the cause. A link made again to the same
// peer is another Peer, with immediates of its own.
func (p *Peer) Imm(ctx context.Context) (Imm, error) {
	if !p.made() {
		return Imm{}, errZeroPeer("imm")
	}
	return p.e.takeImm(ctx, p)
}

// queuedImm is an immediate waiting for Imm, and when it arrived.
type queuedImm struct {
	Imm
	seq uint64
}

// immQueue is one link's immediates not yet taken, in the order they
// arrived, and, once the link has failed, why (under Endpoint.immMu).
type immQueue struct {
	peer string
	q    []queuedImm
	err  error
}

// takeImm is Imm of any link's immediates (p nil) or of p's link's.
func (e *Endpoint) takeImm(ctx context.Context, p *Peer) (Imm, error) {
	ctx, cancel := e.bound(ctx)
	defer cancel()
	var mine *immQueue
	peer := ""
	if p != nil {
		mine, peer = p.l.imm, p.name
	}
	for {
		e.immMu.Lock()
		from := mine
		if from == nil { // the link whose first immediate came first
			first := uint64(0)
			for q := range e.imms {
				if from == nil || q.q[0].seq < first {
					from, first = q, q.q[0].seq
				}
			}
		}
		if from != nil && len(from.q) > 0 {
			v := from.q[0].Imm
			from.q = from.q[1:]
			if len(from.q) == 0 {
				from.q = nil
				delete(e.imms, from)
			}
			e.immN--
			e.immMu.Unlock()
			return v, nil
		}
		if mine != nil && mine.err != nil {
			err := mine.err
			e.immMu.Unlock()
			sentinel := ErrPeerLost
			if errors.Is(err, ErrClosed) { // this endpoint's Close
				sentinel = ErrClosed
			}
			return Imm{}, opErr("imm", peer, "", sentinel, "the link ended: %v", err)
		}
		gen := e.immGen
		e.immMu.Unlock()
		select {
		case <-gen:
		case <-e.done:
			return Imm{}, opErr("imm", peer, "", ErrClosed, "the endpoint is closed")
		case <-ctx.Done():
			return Imm{}, opErr("imm", peer, "", ended(ctx), "no immediate arrived")
		}
	}
}

// pushImm queues v, an immediate that q's link delivered, unless the
// endpoint's queue or the link's share of it is full, or the link has
// failed (a frame its reader had read ahead): Peer.Imm may have said so
// already, and the sender got no answer for it.
func (e *Endpoint) pushImm(q *immQueue, v uint32) bool {
	e.immMu.Lock()
	defer e.immMu.Unlock()
	// The share is the link's, not the peer name's: a link that failed
	// keeps its queue (its immediates were delivered; Endpoint.Imm still
	// hands them over), and a name's share over all its links would let a
	// dead link's queue, which its Peer.Imm no longer drains, refuse the
	// next link's immediates for good. A member that links again, or
	// under another name, has another share: the endpoint's bound holds.
	if e.immN >= maxImm || len(q.q) >= maxImmPeer || q.err != nil {
		return false // full; or the link has failed, and its Peer.Imm said so
	}
	e.immSeq++
	q.q = append(q.q, queuedImm{Imm{Peer: q.peer, Value: v}, e.immSeq})
	e.imms[q] = struct{}{}
	e.immN++
	close(e.immGen)
	e.immGen = make(chan struct{})
	return true
}

// immsEnded records that q's link failed with err, and makes every Imm
// waiting look again: its link's fail at once once q is empty.
func (e *Endpoint) immsEnded(q *immQueue, err error) {
	e.immMu.Lock()
	q.err = err
	close(e.immGen)
	e.immGen = make(chan struct{})
	e.immMu.Unlock()
}

// Close closes every link (their transfers fail with ErrClosed) and the
// listener, and returns when every goroutine of the endpoint has ended and
// no peer touches a region any more. It gives this side's leases of the
// peers' regions back, on every link at once (waiting up to half a
// heartbeat or a second for leases still being granted or copied
// through). Its regions are withdrawn then, as by Deregister: this
// side's transfers on them fail, its copies through the peers' grants
// stop and give the grants back (up to half a heartbeat or a second),
// peers' leases of them are revoked and the memory they copy is waited
// for, up to a heartbeat, before the links close; memory
// still lent then (a peer that did not answer) is waited for until the
// peer's process has exited or another heartbeat has passed (ErrTimeout
// if something still holds a region after that: its memory must not be
// reused). A same-host copy that a peer's memory holds up in the kernel
// is waited for as long, then reported the same way (ErrTimeout: its
// local memory may still be written). A later Close returns once the
// first has, with its error while that still holds (nil once the held
// memory is let go of).
func (e *Endpoint) Close() error {
	if !e.made() {
		return errZeroEndpoint("close")
	}
	e.mu.Lock()
	if e.shut {
		e.mu.Unlock()
		<-e.closed // the first Close's
		// What the first reported, if it still holds (a held-up copy
		// that has not returned yet): not nil, which would say the
		// memory may be reused.
		return e.closeErr(0)
	}
	e.shut = true
	close(e.done)
	defer close(e.closed)
	openTokens.Delete(*e.token)
	peers := make([]*Peer, 0, len(e.peers))
	for _, p := range e.peers {
		peers = append(peers, p)
	}
	regs := make([]*Region, 0, len(e.regs))
	for _, r := range e.regs {
		regs = append(regs, r)
	}
	e.mu.Unlock()
	e.ln.Close()
	var gave sync.WaitGroup // the links at once: each waits up to a second
	for _, p := range peers {
		if p.l != nil {
			gave.Go(p.l.giveBackLeases)
		}
	}
	gave.Wait()
	for _, r := range regs {
		e.withdraw(r, "withdrawn by Close") // a part it leaves to a held-up copy keeps a goroutine of e.wg: see stopped below
	}
	// The copies through the peers' grants (their parts finished now)
	// send their releases before the links end, on every link at once.
	released := time.Now().Add(min(e.opts.Heartbeat/2, time.Second))
	for _, p := range peers {
		if p.l != nil {
			gave.Go(func() { p.l.endGrantCopies(released) })
		}
	}
	gave.Wait()
	e.closedRegs = regs
	e.drained(e.opts.Heartbeat)
	for _, p := range peers {
		if p.l != nil {
			p.l.fail(opErr("close", p.name, "", ErrClosed, "the endpoint was closed"))
		} else {
			e.dropPeer(p, opErr("connect", p.name, "", ErrClosed, "the endpoint was closed"))
		}
	}
	// The links' goroutines end within a chunk of their copies, except a
	// same-host copy that the peer's memory holds up in the kernel: the
	// wait for them is bounded too, and reported below.
	bound := time.Now().Add(2 * e.opts.Heartbeat)
	stopped := make(chan struct{})
	e.stopped = stopped
	go func() { e.wg.Wait(); close(stopped) }()
	t := time.NewTimer(time.Until(bound))
	select {
	case <-stopped:
	case <-t.C:
	}
	t.Stop()
	// Lent memory is released a heartbeat after its link's end at the
	// latest (fail), the links' own references when their goroutines end.
	return e.closeErr(max(time.Until(bound), 0))
}

// drained waits up to d for the regions Close withdrew to be let go of,
// or says which is not.
func (e *Endpoint) drained(d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	for _, r := range e.closedRegs {
		// Closed before t fires (preferred when both are: the timer of a
		// spent bound fires at once).
		if !doneFirst(r.drained, t.C) {
			peer, who := r.holding()
			return opErr("close", peer, r.label(), ErrTimeout, "%s may still use it", who)
		}
	}
	return nil
}

// closeErr is Close's result once the links have ended: the regions
// drained within d, and the endpoint's goroutines ended.
func (e *Endpoint) closeErr(d time.Duration) error {
	if err := e.drained(d); err != nil {
		return err
	}
	select {
	case <-e.stopped:
		return nil
	default:
		return opErr("close", "", "", ErrTimeout, "a goroutine of the endpoint has not ended within two heartbeats (a same-host copy held up in the kernel by a peer's memory): this side's memory may still be written")
	}
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }
