package inter

import (
	"context"
	"fmt"
	"time"
	"unsafe"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/intra"
	"github.com/slimego/slimego/kernels"
)

// Link is an inter-node transport as the algorithms over it (Hier, the
// ring) use it: a send and a receive per peer in flight at a time, each
// started and then waited for, framed with the call's epoch and hash so
// that a peer at another call or with other sizes is ErrSizeMismatch. The
// TCP transport (Transport.Link, over host memory) and the host-staged GPU
// transport (Staged, over device spans) implement it.
type Link[M any] interface {
	intra.Memory[M]
	// Send starts sending buf to peer p (a global rank); WaitSend
	// collects the result. buf must stay untouched until then.
	Send(p int, epoch, hash uint64, buf M, deadline time.Time)
	// SendCopy is Send that also copies buf into also, when CopyRides
	// said so for its length.
	SendCopy(p int, epoch, hash uint64, buf, also M, deadline time.Time)
	// Recv starts receiving into buf from peer p; WaitRecv collects the
	// result, after which buf holds the bytes.
	Recv(p int, epoch, hash uint64, buf M, deadline time.Time)
	WaitSend(p int) error
	WaitRecv(p int) error
	// Direct says whether a message of n bytes moves in the caller's
	// goroutine (a hint for scheduling).
	Direct(n int) bool
	// CopyRides says whether SendCopy should carry the copy of an
	// out-of-place own block of n bytes.
	CopyRides(n int) bool
	// Reserve readies what a send of up to send bytes to peer p and a
	// receive of up to recv bytes from it need, so that they allocate
	// nothing. The algorithms call it when they plan (Set), which every
	// rank finishes before any runs: Staged's buffers are pinned host
	// memory, and cudaFreeHost waits for every kernel of the device,
	// among them a node peer's LL kernel that waits for this rank.
	Reserve(p, send, recv int) error
	// Interrupt ends the transfers in flight at once, with an error, and
	// the link with them (see Transport.Interrupt).
	Interrupt()
	// Lost reports the failure that lost a peer, and interrupted the
	// link, if one did (see Transport.Lost).
	Lost() (peer int, err error)
	// Record writes this rank's account of why it gives up, before it
	// interrupts the link or tells its node (see Transport.Record).
	Record(peer int, err error)
	// Explain names the rank a wait for peer p that failed with err
	// holds responsible (see Transport.Explain).
	Explain(p int, err error) (int, error)
	// Watch and Unwatch bracket a call, whose context's cancellation in
	// between interrupts the link; Cancelled, during the call, and
	// Unwatch, at its end, report that it did (see Transport.Watch).
	Watch(ctx context.Context)
	Unwatch() bool
	Cancelled() bool
	Close() error
}

var (
	_ Link[[]byte]        = tcpLink{}
	_ Link[intra.DevSpan] = (*Staged)(nil)
)

// Link is t as a Link of host memory.
func (t *Transport) Link() Link[[]byte] { return tcpLink{t} }

// tcpLink adds host memory's operations to the TCP transport.
type tcpLink struct{ *Transport }

func (tcpLink) Len(m []byte) int                        { return len(m) }
func (tcpLink) Slice(m []byte, off, n int) []byte       { return m[off : off+n] }
func (tcpLink) Same(a, b []byte) bool                   { return intra.HostMem{}.Same(a, b) }
func (tcpLink) Copy(dst, src []byte, d time.Time) error { return intra.HostMem{}.Copy(dst, src, d) }

// Reserve has nothing to ready: the TCP transport reads and writes the
// caller's bytes.
func (tcpLink) Reserve(int, int, int) error { return nil }

// blame is the error a call that failed with err, waiting for peer,
// reports, and the peer it names: the link's loss where there was one
// (the peer first lost, which ended the wait for this one), else err.
func blame[M any](l Link[M], err error, peer int) (error, int) {
	if p, lerr := l.Lost(); lerr != nil {
		return lerr, p
	}
	return err, peer
}

// Staged carries GPU blocks over a TCP transport through pinned host
// memory: a send copies the device block into the peer's pinned send
// buffer and sends that; a receive lands in the peer's pinned receive
// buffer and WaitRecv copies it into the device block. Every copy is
// enqueued on the transport's own CUDA stream and waited for before the
// bytes are used (by the socket, or by whoever reads the device block
// after WaitRecv), so nothing depends on the order of other streams; the
// device blocks themselves must be complete when Send is called (the
// node's gathers wait for their kernels). Each peer's buffers grow to the
// largest message and are then reused: the algorithms reserve them when
// they plan (Reserve), so that a planned call allocates and frees nothing.
// (Freeing pinned memory waits for the whole device: a rank that grew its
// buffers in Run, after a node peer's LL kernel had started waiting for
// its block, stalled both until the kernel's timeout.)
type Staged struct {
	t      *Transport
	mem    intra.GPUMem
	stages map[int]*stage
	rank   int
}

type stage struct {
	send, recv pinned
	sendErr    error         // a staging error of the pending send
	sent       bool          // the pending send reached the TCP transport
	recvErr    error         // a staging error of the pending receive
	dst        intra.DevSpan // the pending receive's device block
	deadline   time.Time     // and its deadline
}

// pinned is page-locked host memory that the GPU addresses at dptr.
type pinned struct {
	host unsafe.Pointer
	dptr kernels.Ptr
	cap  int
}

// NewStaged carries blocks of dev over t (whose peers it serves).
func NewStaged(t *Transport, dev *device.GPU) (*Staged, error) {
	m, err := intra.NewGPUMem(dev)
	if err != nil {
		return nil, fault.New("init", t.cfg.Rank, -1, fault.ErrInvalid, "staged transport: %v", err)
	}
	s := &Staged{t: t, mem: m, stages: make(map[int]*stage, len(t.cfg.Peers)), rank: t.cfg.Rank}
	for _, p := range t.cfg.Peers {
		s.stages[p] = new(stage)
	}
	return s, nil
}

func (s *Staged) Len(m intra.DevSpan) int                         { return m.N }
func (s *Staged) Slice(m intra.DevSpan, off, n int) intra.DevSpan { return s.mem.Slice(m, off, n) }
func (s *Staged) Same(a, b intra.DevSpan) bool                    { return s.mem.Same(a, b) }
func (s *Staged) Copy(dst, src intra.DevSpan, d time.Time) error {
	return s.mem.Copy(dst, src, d)
}

// Direct is the TCP transport's answer: the staging copies are made in
// the caller's goroutine whatever the size.
func (s *Staged) Direct(n int) bool { return s.t.Direct(n) }

// Interrupt is the transport's: a receive it ends copies nothing into
// its device block.
func (s *Staged) Interrupt() { s.t.Interrupt() }

// Lost is the transport's.
func (s *Staged) Lost() (int, error) { return s.t.Lost() }

// Record is the transport's.
func (s *Staged) Record(peer int, err error) { s.t.Record(peer, err) }

// Explain is the transport's.
func (s *Staged) Explain(p int, err error) (int, error) { return s.t.Explain(p, err) }

// Watch, Unwatch and Cancelled are the transport's.
func (s *Staged) Watch(ctx context.Context) { s.t.Watch(ctx) }
func (s *Staged) Unwatch() bool             { return s.t.Unwatch() }
func (s *Staged) Cancelled() bool           { return s.t.Cancelled() }

// CopyRides is false: the own block's copy is a device copy, not one a
// socket's writer can make.
func (s *Staged) CopyRides(int) bool { return false }

// grow makes b hold at least n bytes.
func (s *Staged) grow(b *pinned, n int) error {
	if b.cap >= n {
		return nil
	}
	lib := s.mem.Dev.Lib()
	if b.host != nil {
		lib.HostFree(s.mem.Dev.Ordinal, b.host)
		*b = pinned{}
	}
	h, d, err := lib.HostAlloc(s.mem.Dev.Ordinal, uint64(max(n, 1)))
	if err != nil {
		return err
	}
	*b = pinned{host: h, dptr: d, cap: n}
	return nil
}

// Reserve grows p's pinned buffers to send and recv bytes (see Link).
func (s *Staged) Reserve(p, send, recv int) error {
	st := s.stage(p)
	if err := s.grow(&st.send, send); err != nil {
		return fmt.Errorf("staging %d bytes for rank %d: %w", send, p, err)
	}
	if err := s.grow(&st.recv, recv); err != nil {
		return fmt.Errorf("staging %d bytes from rank %d: %w", recv, p, err)
	}
	return nil
}

func (b *pinned) bytes(n int) []byte {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(b.host), n)
}

// copyD copies n bytes between device addresses (the pinned buffer's
// included) on the transport's stream and waits for them.
func (s *Staged) copyD(dst, src kernels.Ptr, n int, deadline time.Time) error {
	return s.mem.Copy(intra.DevSpan{Ptr: dst, N: n}, intra.DevSpan{Ptr: src, N: n}, deadline)
}

func (s *Staged) stage(p int) *stage {
	st := s.stages[p]
	if st == nil {
		st = new(stage)
		s.stages[p] = st
	}
	return st
}

// Send stages buf into p's pinned send buffer, then sends it. A failed
// staging copy sends nothing and is WaitSend's error (the peer then waits
// until its deadline).
func (s *Staged) Send(p int, epoch, hash uint64, buf intra.DevSpan, deadline time.Time) {
	st := s.stage(p)
	st.sendErr, st.sent = nil, false
	if err := s.grow(&st.send, buf.N); err != nil {
		st.sendErr = fmt.Errorf("staging %d bytes for rank %d: %w", buf.N, p, err)
		return
	}
	if buf.N > 0 {
		if err := s.copyD(st.send.dptr, buf.Ptr, buf.N, deadline); err != nil {
			st.sendErr = fmt.Errorf("staging %d bytes for rank %d: %w", buf.N, p, err)
			return
		}
	}
	s.t.Send(p, epoch, hash, st.send.bytes(buf.N), deadline)
	st.sent = true
}

// SendCopy is Send, then the copy of buf into also (CopyRides is false:
// the algorithms call it only for their first send, with also empty).
func (s *Staged) SendCopy(p int, epoch, hash uint64, buf, also intra.DevSpan, deadline time.Time) {
	s.Send(p, epoch, hash, buf, deadline)
	st := s.stage(p)
	if also.N > 0 && st.sendErr == nil {
		if err := s.copyD(also.Ptr, buf.Ptr, buf.N, deadline); err != nil {
			st.sendErr = err
		}
	}
}

// Recv receives into p's pinned receive buffer; WaitRecv moves the bytes
// into buf.
func (s *Staged) Recv(p int, epoch, hash uint64, buf intra.DevSpan, deadline time.Time) {
	st := s.stage(p)
	st.dst, st.deadline, st.recvErr = buf, deadline, nil
	if err := s.grow(&st.recv, buf.N); err != nil {
		st.recvErr = fmt.Errorf("staging %d bytes from rank %d: %w", buf.N, p, err)
		return
	}
	s.t.Recv(p, epoch, hash, st.recv.bytes(buf.N), deadline)
}

// WaitSend waits for the send (if it started) and returns its error, the
// staging copies' first.
func (s *Staged) WaitSend(p int) error {
	st := s.stage(p)
	var err error
	if st.sent {
		err = s.t.WaitSend(p)
		st.sent = false
	}
	if st.sendErr != nil {
		err, st.sendErr = st.sendErr, nil
	}
	return err
}

// WaitRecv waits for the bytes, then copies them into the device block
// and waits for that copy.
func (s *Staged) WaitRecv(p int) error {
	st := s.stage(p)
	if st.recvErr != nil {
		return st.recvErr
	}
	if err := s.t.WaitRecv(p); err != nil {
		return err
	}
	if st.dst.N == 0 {
		return nil
	}
	if err := s.copyD(st.dst.Ptr, st.recv.dptr, st.dst.N, st.deadline); err != nil {
		return fmt.Errorf("unstaging %d bytes from rank %d: %w", st.dst.N, p, err)
	}
	return nil
}

// Close frees the pinned buffers and the stream, then closes the TCP
// transport.
func (s *Staged) Close() error {
	lib := s.mem.Dev.Lib()
	for _, st := range s.stages {
		for _, b := range []*pinned{&st.send, &st.recv} {
			if b.host != nil {
				lib.HostFree(s.mem.Dev.Ordinal, b.host)
				*b = pinned{}
			}
		}
	}
	s.mem.S.Close()
	return s.t.Close()
}
