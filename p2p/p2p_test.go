package p2p

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/auth"
)

// transports runs test over TCP and, to a peer on this host, over the
// same-host transport, naming the transport each must report.
func transports(t *testing.T, test func(t *testing.T, tcpOnly bool, want string)) {
	t.Run("tcp", func(t *testing.T) { test(t, true, "tcp") })
	t.Run("cma", func(t *testing.T) { test(t, false, "cma") })
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestProcessReadWrite: a child process registers a region of random
// bytes; this process reads it whole (striped over the connections),
// checks every byte, writes fresh random bytes over it, reads them back,
// and does the same with a batch of 64 scattered ranges. The transfers
// report the transport that carried them.
func TestProcessReadWrite(t *testing.T) { transports(t, testProcessReadWrite) }

func testProcessReadWrite(t *testing.T, tcpOnly bool, wantT string) {
	processReadWrite(t, "target", tcpOnly, wantT)
}

// TestProcessReadWriteShared: the same with a child whose region is
// Shared memory: on this host the parent maps it and copies through the
// mapping ("shm"), the batch's 64 ranges through one mapping; over TCP it
// is a region as any other.
func TestProcessReadWriteShared(t *testing.T) {
	t.Run("tcp", func(t *testing.T) { processReadWrite(t, "shared-target", true, "tcp") })
	t.Run("shm", func(t *testing.T) { processReadWrite(t, "shared-target", false, "shm") })
}

// TestProcessReadWriteSymmetric: the same with a child whose region is
// intra's symmetric memory (its part of a file in /dev/shm, at an offset)
// made Shared by MapShared: the parent maps the file and copies through
// it ("shm"), also where the child runs in a mount namespace of its own
// (as `ip netns exec` puts it, or a container given the host's /dev/shm):
// its /dev/shm is another mount of the same file system.
func TestProcessReadWriteSymmetric(t *testing.T) {
	t.Run("tcp", func(t *testing.T) { processReadWrite(t, "symmetric-target", true, "tcp") })
	t.Run("shm", func(t *testing.T) { processReadWrite(t, "symmetric-target", false, "shm") })
	t.Run("shm/mount-namespace", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("a mount namespace needs root")
		}
		processReadWrite(t, "symmetric-target+mountns", false, "shm")
	})
}

// parentOf starts a child of the given role whose region holds size
// bytes from seed, and links a fresh endpoint "parent" (over TCP only, if
// tcpOnly) to it; the endpoint closes when the test ends.
func parentOf(t *testing.T, role string, size int, seed uint64, tcpOnly bool) (*Endpoint, *Peer, context.Context) {
	t.Helper()
	addr, st := storeFor(t)
	startChild(t, role, addr, size, seed)
	ctx := ctxT(t, 60*time.Second)
	e := endpoint(t, ctx, Options{Name: "parent", Store: st, Auth: testAuth(), TCPOnly: tcpOnly})
	p, err := e.Connect(ctx, "child")
	if err != nil {
		t.Fatal(err)
	}
	return e, p, ctx
}

// gpuOrSkip is GPU 0 (of the emulated CUDA library where there is no
// GPU); it skips the test without a CUDA backend.
func gpuOrSkip(t *testing.T) *device.GPU {
	t.Helper()
	if gpuErr != nil {
		t.Skip("no CUDA backend:", gpuErr)
	}
	g, err := device.OpenGPU(0)
	if err != nil {
		t.Skip("no GPU:", err)
	}
	return g
}

// gpuAllocFor is n bytes of GPU memory on g, freed when the test ends,
// after the endpoints made later have closed.
func gpuAllocFor(t *testing.T, g *device.GPU, n int) *device.CUDABuffer {
	t.Helper()
	d, err := g.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Free() })
	return d
}

func processReadWrite(t *testing.T, role string, tcpOnly bool, wantT string) {
	const size = 24<<20 + 12345
	e, p, ctx := parentOf(t, role, size, 7, tcpOnly)
	rr, ok := p.Remote("mem")
	if !ok || rr.Size != size {
		t.Fatalf("the child's info lists %+v (%v)", rr, ok)
	}
	want := make([]byte, size)
	fill(want, 7)
	local := make([]byte, size)
	lr, err := e.Register("local", local)
	if err != nil {
		t.Fatal(err)
	}
	f := p.Read([]Op{{Local: lr, Remote: rr, Len: size}})
	if err := f.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if f.Transport() != wantT {
		t.Errorf("transport %q, want %q", f.Transport(), wantT)
	}
	if !bytes.Equal(local, want) {
		t.Fatal("the bytes read differ from the child's")
	}
	// Write fresh bytes, read them back into a cleared buffer.
	fill(local, 99)
	copy(want, local)
	if err := p.Write([]Op{{Local: lr, Remote: rr, Len: size}}).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	clear(local)
	if err := p.Read([]Op{{Local: lr, Remote: rr, Len: size}}).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(local, want) {
		t.Fatal("the bytes written then read back differ")
	}
	// A batch of 64 ranges of random lengths at random places (over
	// TCP, batches of at most cmaMin travel in the request or answer).
	rng := rand.New(rand.NewPCG(1, 2))
	var ops []Op
	slot := size / 64
	for i := range 64 {
		n := 1 + rng.IntN(slot/2)
		ops = append(ops, Op{Local: lr, LocalOff: i*slot + rng.IntN(slot/2), Remote: rr, RemoteOff: (63-i)*slot + rng.IntN(slot/2), Len: n})
	}
	fill(local, 5)
	src := append([]byte(nil), local...)
	fw := p.Write(ops)
	if err := fw.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if fw.Transport() != wantT {
		t.Errorf("batched write: transport %q, want %q", fw.Transport(), wantT)
	}
	for _, o := range ops {
		copy(want[o.RemoteOff:o.RemoteOff+o.Len], src[o.LocalOff:o.LocalOff+o.Len])
	}
	clear(local)
	if err := p.Read([]Op{{Local: lr, Remote: rr, Len: size}}).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(local, want) {
		t.Fatal("after the batched write the child's region is not what was written")
	}
	// And a batched read of the same ranges.
	clear(local)
	if err := p.Read(ops).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	for i, o := range ops {
		if !bytes.Equal(local[o.LocalOff:o.LocalOff+o.Len], want[o.RemoteOff:o.RemoteOff+o.Len]) {
			t.Fatalf("batched read, range %d differs", i)
		}
	}
}

// TestProcessKilled: a peer process that is killed fails the transfers
// waiting on it with ErrPeerLost, long before their deadline.
func TestProcessKilled(t *testing.T) { transports(t, testProcessKilled) }

func testProcessKilled(t *testing.T, tcpOnly bool, wantT string) {
	addr, st := storeFor(t)
	cmd := startChild(t, "echo", addr, 1<<20, 1)
	ctx := ctxT(t, 30*time.Second)
	e := endpoint(t, ctx, Options{Name: "parent", Store: st, Auth: testAuth(), TCPOnly: tcpOnly})
	if err := e.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	p, err := e.Connect(ctx, "child")
	if err != nil {
		t.Fatal(err)
	}
	if p.Transport() != wantT {
		t.Errorf("transport %q, want %q", p.Transport(), wantT)
	}
	// The echo works.
	msg := make([]byte, 1000)
	fill(msg, 3)
	got := make([]byte, 1000)
	if err := p.Send(msg).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Recv(got).Wait(ctx); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("echo: %v", err)
	}
	// A receive the child will never answer, then the child dies.
	f := p.Recv(got)
	cmd.Process.Kill()
	if err := f.Wait(ctx); !errors.Is(err, ErrPeerLost) || !isOp(err, "recv", "child") {
		t.Fatalf("a receive from a killed peer: %v, want ErrPeerLost of op recv naming the peer", err)
	}
	if ctx.Err() != nil {
		t.Fatal("the failure came only at the test's deadline")
	}
	// Calls after the loss fail at once, each named after its operation.
	lr, _ := e.Register("l", make([]byte, 8))
	rr := RemoteRegion{Name: "r", Size: 8}
	for op, f := range map[string]*Future{
		"send":     p.Send(msg),
		"recv":     p.Recv(got),
		"read":     p.Read([]Op{{Local: lr, Remote: rr, Len: 8}}),
		"write":    p.Write([]Op{{Local: lr, Remote: rr, Len: 8}}),
		"writeimm": p.WriteWithImm([]Op{{Local: lr, Remote: rr, Len: 8}}, 1),
	} {
		if err := f.Wait(ctx); !errors.Is(err, ErrPeerLost) || !isOp(err, op, "child") {
			t.Errorf("a %s after the loss: %v, want ErrPeerLost of op %s naming the peer", op, err, op)
		}
	}
	if _, err := p.Imm(ctx); !errors.Is(err, ErrPeerLost) || !isOp(err, "imm", "child") {
		t.Errorf("Peer.Imm after the loss: %v, want ErrPeerLost of op imm naming the peer", err)
	}
}

// isOp reports whether err is an *OpError of operation op and peer.
func isOp(err error, op, peer string) bool {
	var oe *OpError
	return errors.As(err, &oe) && oe.Op == op && oe.Peer == peer
}

// TestRefused: requests outside a region, with a wrong key, to a region
// never registered and to a deregistered one are refused on both sides
// (ErrRefused here, OnRefuse there), and nothing is read or written.
func TestRefused(t *testing.T) { transports(t, testRefused) }

func testRefused(t *testing.T, tcpOnly bool, wantT string) {
	var refusedMu sync.Mutex
	var refused []error
	_, b, ab, _ := pair(t, func(o *Options) {
		o.TCPOnly = tcpOnly
		o.OnRefuse = func(err error) { refusedMu.Lock(); refused = append(refused, err); refusedMu.Unlock() }
	})
	a := ab.e
	ctx := ctxT(t, 30*time.Second)
	tmem := make([]byte, 1<<20)
	fill(tmem, 11)
	orig := append([]byte(nil), tmem...)
	tr, err := b.Register("t", tmem)
	if err != nil {
		t.Fatal(err)
	}
	gone, err := b.Register("gone", make([]byte, 4096))
	if err != nil {
		t.Fatal(err)
	}
	goneRemote := gone.Remote()
	if err := b.Deregister(ctx, gone); err != nil {
		t.Fatal(err)
	}
	lmem := make([]byte, 2<<20)
	fill(lmem, 12)
	lorig := append([]byte(nil), lmem...)
	lr, err := a.Register("l", lmem)
	if err != nil {
		t.Fatal(err)
	}
	good := tr.Remote()
	big := good
	big.Size = 4 << 20 // a forged size: this side's check passes, the target's must not
	wrongKey := good
	wrongKey.Key ^= 1
	unknown := good
	unknown.ID += 1000
	cases := []struct {
		name string
		op   Op
	}{
		{"past the end", Op{Local: lr, Remote: big, RemoteOff: 1<<20 - 10, Len: 100}},
		{"far outside", Op{Local: lr, Remote: big, RemoteOff: 3 << 20, Len: 1 << 20}},
		{"wrong key", Op{Local: lr, Remote: wrongKey, Len: 100}},
		{"never registered", Op{Local: lr, Remote: unknown, Len: 100}},
		{"deregistered", Op{Local: lr, Remote: goneRemote, Len: 100}},
	}
	for _, c := range cases {
		for _, write := range []bool{false, true} {
			// A large valid op first in the batch, so that the batch is
			// striped and its first stripe is all valid: the whole batch
			// is refused all the same.
			ops := []Op{{Local: lr, LocalOff: 5000, Remote: good, RemoteOff: 7, Len: 1<<20 - 7}, c.op}
			before := b.Refused()
			f := ab.Read(ops)
			if write {
				f = ab.Write(ops)
			}
			err := f.Wait(ctx)
			if !errors.Is(err, ErrRefused) {
				t.Fatalf("%s (write %v): %v, want ErrRefused", c.name, write, err)
			}
			var oe *OpError
			if !errors.As(err, &oe) || oe.Peer != "b" {
				t.Errorf("%s: the error does not name the peer: %v", c.name, err)
			}
			if !bytes.Equal(tmem, orig) || !bytes.Equal(lmem, lorig) {
				t.Fatalf("%s (write %v): a refused request changed memory", c.name, write)
			}
			if b.Refused() == before {
				t.Errorf("%s (write %v): the target recorded no refusal", c.name, write)
			}
		}
	}
	// A batch of several stripes is refused once per stripe; its Wait
	// returns at the first refusal, so the last batch's others may still
	// be on their way to the target when the loop ends.
	eventually(t, "every refusal counted is reported", func() bool {
		refusedMu.Lock()
		defer refusedMu.Unlock()
		return len(refused) == int(b.Refused())
	})
	refusedMu.Lock()
	for _, err := range refused {
		var oe *OpError
		if !errors.Is(err, ErrRefused) || !errors.As(err, &oe) || oe.Peer != "a" {
			t.Errorf("the target's refusal does not name the peer: %v", err)
		}
	}
	refusedMu.Unlock()
	// The link is still good after refusals.
	if err := ab.Read([]Op{{Local: lr, Remote: good, Len: 1 << 20}}).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(lmem[:1<<20], orig) {
		t.Fatal("read after refusals differs")
	}
}

// TestLocalChecks: operations that are wrong on this side fail at once
// with ErrInvalid, and none reaches the peer.
func TestLocalChecks(t *testing.T) {
	_, b, ab, _ := pair(t, nil)
	a := ab.e
	ctx := ctxT(t, 10*time.Second)
	lr, _ := a.Register("l", make([]byte, 100))
	tr, _ := b.Register("t", make([]byte, 100))
	other, _ := b.Register("o", make([]byte, 100))
	huge := tr.Remote()
	huge.Size = 4 * MaxLen
	many := make([]Op, MaxBatch+1)
	for i := range many {
		many[i] = Op{Local: lr, Remote: tr.Remote(), Len: 1}
	}
	for _, tc := range []struct {
		name string
		ops  []Op
		want string // in the error: what is wrong, and where
	}{
		{"empty", nil, "a batch of 0 operations"},
		{"too many", many, fmt.Sprintf("a batch of %d operations", MaxBatch+1)},
		{"zero length", []Op{{Local: lr, Remote: tr.Remote()}}, "operation 0: a length of 0 (1 byte or more)"},
		{"negative length", []Op{{Local: lr, Remote: tr.Remote(), Len: -1}}, "operation 0: a length of -1"},
		{"local past", []Op{{Local: lr, LocalOff: 50, Remote: tr.Remote(), Len: 51}}, `region "l": p2p: invalid argument: operation 0: 51 bytes at 50 of a local region of 100`},
		{"remote past", []Op{{Local: lr, Remote: tr.Remote(), RemoteOff: 99, Len: 2}}, `region "t": p2p: invalid argument: operation 0: 2 bytes at 99 of a remote region of 100`},
		{"negative local", []Op{{Local: lr, LocalOff: -1, Remote: tr.Remote(), Len: 2}}, `region "l": p2p: invalid argument: operation 0: 2 bytes at -1 of a local region`},
		{"negative remote", []Op{{Local: lr, Remote: tr.Remote(), RemoteOff: -1, Len: 2}}, `region "t": p2p: invalid argument: operation 0: 2 bytes at -1 of a remote region`},
		// A made-up RemoteRegion larger than any region can be: an
		// offset past MaxLen would break the protocol (the target ends
		// the link), so it is refused here.
		{"remote past MaxLen", []Op{{Local: lr, Remote: huge, RemoteOff: MaxLen + 1, Len: 2}}, fmt.Sprintf(`region "t": p2p: invalid argument: operation 0: an offset of %d, past the largest region`, uint64(MaxLen+1))},
		{"nil local", []Op{{Remote: tr.Remote(), Len: 2}}, "operation 0: its local region is not this endpoint's"},
		{"not my local", []Op{{Local: other, Remote: tr.Remote(), Len: 2}}, "operation 0: its local region is not this endpoint's"},
	} {
		err := ab.Write(tc.ops).Wait(ctx)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrInvalid saying %q", tc.name, err, tc.want)
		}
	}
	if b.Refused() != 0 {
		t.Errorf("the peer saw %d requests", b.Refused())
	}
	// Nothing of the refused calls reached the link: it carries on.
	if err := ab.Write([]Op{{Local: lr, Remote: tr.Remote(), Len: 100}}).Wait(ctx); err != nil {
		t.Errorf("a good write after the refused ones: %v", err)
	}
}

// TestCancelReuse: a read cancelled mid-transfer returns at once with
// ErrCancelled, and nothing of it lands in the buffer afterwards: the
// buffer, refilled by the caller, keeps the caller's bytes while the
// link carries on (the race detector would also see a late write).
func TestCancelReuse(t *testing.T) { transports(t, testCancelReuse) }

func testCancelReuse(t *testing.T, tcpOnly bool, wantT string) {
	_, b, ab, _ := pair(t, func(o *Options) { o.TCPOnly = tcpOnly })
	a := ab.e
	ctx := ctxT(t, 60*time.Second)
	const size = 64 << 20
	tmem := make([]byte, size)
	fill(tmem, 21)
	tr, _ := b.Register("t", tmem)
	lmem := make([]byte, size)
	lr, _ := a.Register("l", lmem)
	for round := range 5 {
		f := ab.Read([]Op{{Local: lr, Remote: tr.Remote(), Len: size}})
		cctx, cancel := context.WithCancel(ctx)
		go func() { time.Sleep(time.Duration(round) * time.Millisecond); cancel() }()
		err := f.Wait(cctx)
		cancel()
		if err == nil {
			continue // it finished first
		}
		if !errors.Is(err, ErrCancelled) {
			t.Fatalf("round %d: %v, want ErrCancelled", round, err)
		}
		for i := range lmem {
			lmem[i] = 0xA5
		}
		// Other transfers on the link carry on, in both directions.
		small := make([]byte, 4096)
		sr, _ := a.Register("s", small)
		if err := ab.Read([]Op{{Local: sr, Remote: tr.Remote(), Len: 4096}}).Wait(ctx); err != nil {
			t.Fatal(err)
		}
		a.Deregister(ctx, sr)
		for i := range lmem {
			if lmem[i] != 0xA5 {
				t.Fatalf("round %d: byte %d of the reused buffer was overwritten after the cancel", round, i)
			}
		}
	}
	// A cancelled write, then the buffer reused for a full write that
	// lands whole.
	fill(lmem, 22)
	f := ab.Write([]Op{{Local: lr, Remote: tr.Remote(), Len: size}})
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := f.Wait(cctx); err != nil && !errors.Is(err, ErrCancelled) {
		t.Fatal(err)
	}
	fill(lmem, 23)
	if err := ab.Write([]Op{{Local: lr, Remote: tr.Remote(), Len: size}}).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(tmem, lmem) {
		t.Fatal("the write after a cancelled one did not land whole")
	}
	// Nothing is left behind: no part on this side, nothing served or
	// lent on the other, and the regions deregister at once.
	ba := b.Peer("a")
	eventually(t, "the cancelled transfers' state to drain", func() bool {
		n := 0
		for _, l := range []*link{ab.l, ba.l} {
			l.mu.Lock()
			// A lease stays until its region is deregistered (below).
			n += len(l.parts) + len(l.sends) + len(l.recvs) + len(l.serving) + len(l.grants) - len(l.leased)
			l.mu.Unlock()
		}
		return n == 0
	})
	if err := b.Deregister(ctx, tr); err != nil {
		t.Fatal(err)
	}
	if err := a.Deregister(ctx, lr); err != nil {
		t.Fatal(err)
	}
}

// eventually polls cond for up to 10 s (state that settles as goroutines
// finish), failing the test if it never holds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("waited 10 s for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestCloseEndsGoroutines: closing two linked endpoints ends every
// goroutine they started.
func TestCloseEndsGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	ctx := ctxT(t, 20*time.Second)
	a, err := New(ctx, Options{Name: "a", Auth: testAuth()})
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(ctx, Options{Name: "b", Auth: testAuth()})
	if err != nil {
		t.Fatal(err)
	}
	p, err := a.ConnectInfo(ctx, b.Info())
	if err != nil {
		t.Fatal(err)
	}
	pending := p.Recv(make([]byte, 10)) // never matched: Close fails it
	a.Close()
	b.Close()
	if err := pending.Wait(ctx); !errors.Is(err, ErrClosed) && !errors.Is(err, ErrPeerLost) {
		t.Fatalf("a receive pending at Close: %v", err)
	}
	eventually(t, "the endpoints' goroutines to end", func() bool { return runtime.NumGoroutine() <= before })
}

// TestSendRecvOrder: sends are matched with receives in order, whether
// the receive is posted before or after the send, in both directions at
// once; a message larger than the receive fails both sides.
func TestSendRecvOrder(t *testing.T) {
	_, _, ab, ba := pair(t, nil)
	ctx := ctxT(t, 60*time.Second)
	const n = 200
	msgs := make([][]byte, n)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range msgs {
		msgs[i] = make([]byte, 1+rng.IntN(3<<20>>(i%8)))
		fill(msgs[i], uint64(i))
	}
	run := func(from, to *Peer) error {
		var wg sync.WaitGroup
		var sendErr atomic.Value
		wg.Add(1)
		go func() {
			defer wg.Done()
			var fs []*Future
			for i, m := range msgs {
				fs = append(fs, from.Send(m))
				if i%7 == 0 {
					time.Sleep(time.Millisecond)
				}
			}
			for _, f := range fs {
				if err := f.Wait(ctx); err != nil {
					sendErr.Store(err)
				} else if f.Transport() != "tcp" {
					sendErr.Store(fmt.Errorf("a send reports transport %q, want tcp (a same-host link sends over TCP)", f.Transport()))
				}
			}
		}()
		bufs := make([][]byte, n)
		var fs []*Future
		for i := range msgs {
			bufs[i] = make([]byte, 3<<20)
			fs = append(fs, to.Recv(bufs[i]))
			if i%5 == 0 {
				time.Sleep(time.Millisecond)
			}
		}
		for i, f := range fs {
			if err := f.Wait(ctx); err != nil {
				return err
			}
			if f.Len() != len(msgs[i]) || !bytes.Equal(bufs[i][:f.Len()], msgs[i]) {
				t.Errorf("message %d: %d bytes, want %d, or they differ", i, f.Len(), len(msgs[i]))
			}
			if f.Transport() != "tcp" {
				t.Errorf("message %d: a receive reports transport %q, want tcp", i, f.Transport())
			}
		}
		wg.Wait()
		if e := sendErr.Load(); e != nil {
			return e.(error)
		}
		return nil
	}
	errs := make(chan error, 2)
	go func() { errs <- run(ab, ba) }()
	go func() { errs <- run(ba, ab) }()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// Too large for the receive: both sides fail, and the next pair works.
	fs := ab.Send(make([]byte, 100))
	fr := ba.Recv(make([]byte, 10))
	if err := fs.Wait(ctx); !errors.Is(err, ErrRefused) {
		t.Fatalf("send larger than the receive: %v", err)
	}
	if err := fr.Wait(ctx); !errors.Is(err, ErrRefused) {
		t.Fatalf("receive smaller than the send: %v", err)
	}
	fs = ab.Send([]byte("next"))
	buf := make([]byte, 10)
	if err := ba.Recv(buf).Wait(ctx); err != nil || string(buf[:4]) != "next" {
		t.Fatalf("the pair after a refused one: %v %q", err, buf)
	}
	if err := fs.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	// A cancelled receive: its send fails, the next pair matches.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := ba.Recv(buf).Wait(cctx); !errors.Is(err, ErrCancelled) {
		t.Fatalf("cancelled receive: %v", err)
	}
	if err := ab.Send([]byte("lost")).Wait(ctx); !errors.Is(err, ErrCancelled) {
		t.Fatalf("a send to a cancelled receive: %v", err)
	}
	fs = ab.Send([]byte("again"))
	if err := ba.Recv(buf).Wait(ctx); err != nil || string(buf[:5]) != "again" {
		t.Fatalf("after a cancelled receive: %v %q", err, buf)
	}
	if err := fs.Wait(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestWriteWithImm: the target takes the immediate in after the batch's
// bytes are in its region: batches of one stripe (over TCP the immediate
// rides in the write's request) and of several (it follows them).
func TestWriteWithImm(t *testing.T) { transports(t, testWriteWithImm) }

func testWriteWithImm(t *testing.T, tcpOnly bool, wantT string) {
	a, b, ab, _ := pair(t, func(o *Options) { o.TCPOnly = tcpOnly })
	ctx := ctxT(t, 30*time.Second)
	for _, tc := range []struct{ pages, page int }{{1, 8}, {64, 4096 + 17}, {64, 64<<10 + 3}} {
		t.Run(fmt.Sprintf("%dx%d", tc.pages, tc.page), func(t *testing.T) {
			writeWithImm(t, ctx, a, b, ab, tc.pages, tc.page, wantT)
		})
	}
	// No operations: the immediate alone (a signal with no bytes, as a
	// zero-length write with immediate on RDMA), after a write whose
	// Wait returned. It was refused as a batch of 0 operations.
	t.Run("alone", func(t *testing.T) {
		for round := range 3 {
			f := ab.WriteWithImm(nil, uint32(700+round))
			if err := f.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			if f.Transport() != "tcp" {
				t.Errorf("transport %q, want tcp", f.Transport())
			}
			im, err := b.Imm(ctx)
			if err != nil || im.Value != uint32(700+round) || im.Peer != "a" {
				t.Fatalf("immediate %+v, %v; want %d from a", im, err, 700+round)
			}
		}
	})
}

func writeWithImm(t *testing.T, ctx context.Context, a, b *Endpoint, ab *Peer, pages, page int, wantT string) {
	tmem := make([]byte, pages*page)
	tr, _ := b.Register(fmt.Sprint("kv", page), tmem)
	lmem := make([]byte, pages*page)
	fill(lmem, uint64(31+page))
	lr, _ := a.Register(fmt.Sprint("src", page), lmem)
	small := pages*page <= cmaMin // over TCP on one host too, until a lease serves them
	for round := range 3 {
		var ops []Op
		for i := range pages {
			ops = append(ops, Op{Local: lr, LocalOff: i * page, Remote: tr.Remote(), RemoteOff: (pages - 1 - i) * page, Len: page})
		}
		f := ab.WriteWithImm(ops, uint32(100+round))
		if err := f.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if f.Transport() != wantT && !(small && f.Transport() == "tcp") {
			t.Errorf("transport %q, want %q", f.Transport(), wantT)
		}
		im, err := b.Imm(ctx)
		if err != nil || im.Value != uint32(100+round) || im.Peer != "a" {
			t.Fatalf("immediate %+v, %v", im, err)
		}
		for i := range pages {
			if !bytes.Equal(tmem[(pages-1-i)*page:(pages-i)*page], lmem[i*page:(i+1)*page]) {
				t.Fatalf("page %d differs when the immediate arrived", i)
			}
		}
	}
}

// TestDeregisterFailsLocal: deregistering a region this side's transfer
// uses fails that transfer with ErrClosed, and Deregister returns.
func TestDeregisterFailsLocal(t *testing.T) { transports(t, testDeregisterFailsLocal) }

func testDeregisterFailsLocal(t *testing.T, tcpOnly bool, wantT string) {
	a, b, ab, _ := pair(t, func(o *Options) { o.TCPOnly = tcpOnly })
	ctx := ctxT(t, 30*time.Second)
	const size = 64 << 20
	tr, _ := b.Register("t", make([]byte, size))
	lr, _ := a.Register("l", make([]byte, size))
	f := ab.Read([]Op{{Local: lr, Remote: tr.Remote(), Len: size}})
	if err := a.Deregister(ctx, lr); err != nil {
		t.Fatal(err)
	}
	if err := f.Wait(ctx); err != nil && !errors.Is(err, ErrClosed) {
		t.Fatalf("a read into a deregistered region: %v", err)
	}
	if err := ab.Read([]Op{{Local: lr, Remote: tr.Remote(), Len: 10}}).Wait(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("a read into a region deregistered before: %v", err)
	}
	// Deregistering the target's region stops a write being served.
	lr2, _ := a.Register("l2", make([]byte, size))
	f = ab.Write([]Op{{Local: lr2, Remote: tr.Remote(), Len: size}})
	if err := b.Deregister(ctx, tr); err != nil {
		t.Fatal(err)
	}
	if err := f.Wait(ctx); err != nil && !errors.Is(err, ErrRefused) {
		t.Fatalf("a write to a region deregistered meanwhile: %v", err)
	}
}

// TestSilentPeer: a peer that passes the handshake and then neither reads
// nor writes nor closes fails the transfers within the heartbeat deadline
// with ErrTimeout.
func TestSilentPeer(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	e, err := New(ctx, Options{Name: "a", Auth: testAuth(), Heartbeat: 300 * time.Millisecond, Channels: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var held []net.Conn
	var mu sync.Mutex
	defer func() {
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	}()
	go func() {
		k := auth.NewKey(testAuth().Secret, testAuth().Job)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
			if auth.Accept(c, k, shakePurpose("silent", c.LocalAddr().String()), time.Now().Add(5*time.Second)) != nil {
				continue
			}
			var b [HeaderSize + helloFixed + MaxName]byte
			readFull(c, b[:HeaderSize])
			h, _ := decodeHeader(b[:HeaderSize])
			readFull(c, b[HeaderSize:HeaderSize+int(h.payload)])
			ack := header{kind: kHelloAck}
			ack.put(b[:])
			c.Write(b[:HeaderSize])
			// then silence
		}
	}()
	in := info{name: "silent", addr: ln.Addr().String(), regions: []RemoteRegion{{Name: "m", ID: 1, Key: 2, Size: 1 << 20}}}
	p, err := e.ConnectInfo(ctx, in.encode())
	if err != nil {
		t.Fatal(err)
	}
	lr, _ := e.Register("l", make([]byte, 1<<20))
	rr, _ := p.Remote("m")
	err = p.Read([]Op{{Local: lr, Remote: rr, Len: 1 << 20}}).Wait(ctx)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("a read from a silent peer: %v, want ErrTimeout", err)
	}
	if ctx.Err() != nil {
		t.Fatal("it failed only at the test's deadline")
	}
}

// TestWrongSecret: an endpoint of another job (another secret) cannot
// link.
func TestWrongSecret(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	a := endpoint(t, ctx, Options{Name: "a", Auth: testAuth()})
	b := endpoint(t, ctx, Options{Name: "b", Auth: rendezvous_Auth("other")})
	if _, err := b.ConnectInfo(ctx, a.Info()); !errors.Is(err, ErrRefused) {
		t.Fatalf("connect with another secret: %v", err)
	}
}

// TestConnectBothSides: both ends connecting at once get one link.
func TestConnectBothSides(t *testing.T) {
	for range 5 {
		ctx := ctxT(t, 20*time.Second)
		// The ends may ask for different numbers of connections: the
		// link has the dialer's.
		a, err := New(ctx, Options{Name: "a", Auth: testAuth(), Channels: 3})
		if err != nil {
			t.Fatal(err)
		}
		b, err := New(ctx, Options{Name: "b", Auth: testAuth()})
		if err != nil {
			t.Fatal(err)
		}
		var pa, pb *Peer
		var ea, eb error
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); pa, ea = a.ConnectInfo(ctx, b.Info()) }()
		go func() { defer wg.Done(); pb, eb = b.ConnectInfo(ctx, a.Info()) }()
		wg.Wait()
		if ea != nil || eb != nil {
			t.Fatal(ea, eb)
		}
		buf := make([]byte, 5)
		fs := pa.Send([]byte("hello"))
		if err := pb.Recv(buf).Wait(ctx); err != nil || string(buf) != "hello" {
			t.Fatalf("%v %q", err, buf)
		}
		if err := fs.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		a.Close()
		b.Close()
	}
}

// TestGPU: GPU memory (the emulated CUDA backend here) registered on
// either side is read and written, staged through host memory over TCP,
// to and from host and GPU memory, every byte checked; on a same-host
// link within one process (which cannot open its own IPC handles) a
// request for the peer's GPU memory goes over TCP and says so.
func TestGPU(t *testing.T) { transports(t, testGPU) }

func testGPU(t *testing.T, tcpOnly bool, wantT string) {
	g := gpuOrSkip(t)
	a, b, ab, _ := pair(t, func(o *Options) { o.TCPOnly = tcpOnly })
	ctx := ctxT(t, 60*time.Second)
	const size = 3<<20 + 333
	alloc := func(seed uint64) (*device.CUDABuffer, []byte) {
		d, err := g.Alloc(size)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Free() })
		h := make([]byte, size)
		fill(h, seed)
		if err := d.CopyFromHost(h); err != nil {
			t.Fatal(err)
		}
		return d, h
	}
	contents := func(d *device.CUDABuffer) []byte {
		h := make([]byte, size)
		if err := d.CopyToHost(h); err != nil {
			t.Fatal(err)
		}
		return h
	}
	tg, tgWant := alloc(1) // b's GPU region
	rg, err := b.Register("gpu", tg)
	if err != nil {
		t.Fatal(err)
	}
	th := make([]byte, size) // b's host region
	fill(th, 2)
	rh, _ := b.Register("host", th)
	lg, lgWant := alloc(3) // a's GPU region
	lgr, err := a.Register("lgpu", lg)
	if err != nil {
		t.Fatal(err)
	}
	lh := make([]byte, size)
	lhr, _ := a.Register("lhost", lh)
	// GPU → host (read), across a batch of two ranges.
	half := size / 2
	f := ab.Read([]Op{{Local: lhr, Remote: rg.Remote(), Len: half}, {Local: lhr, LocalOff: half, Remote: rg.Remote(), RemoteOff: half, Len: size - half}})
	if err := f.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if f.Transport() != "tcp" {
		t.Errorf("a read of the peer's GPU memory reports %q", f.Transport())
	}
	if !bytes.Equal(lh, tgWant) {
		t.Fatal("GPU → host read differs")
	}
	// host → GPU (write), then GPU → GPU (write), then GPU ← host (read).
	fill(lh, 4)
	if err := ab.Write([]Op{{Local: lhr, Remote: rg.Remote(), Len: size}}).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(contents(tg), lh) {
		t.Fatal("host → GPU write differs")
	}
	if err := ab.Write([]Op{{Local: lgr, Remote: rg.Remote(), Len: size}}).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(contents(tg), lgWant) {
		t.Fatal("GPU → GPU write differs")
	}
	f = ab.Read([]Op{{Local: lgr, Remote: rh.Remote(), Len: size}})
	if err := f.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(contents(lg), th) {
		t.Fatal("host → GPU read differs")
	}
	if f.Transport() != "tcp" {
		t.Errorf("a read into this side's GPU memory reports %q", f.Transport())
	}
	_ = wantT
}

// TestGPUIPC: a child process on this host registers GPU memory (a view
// at an odd offset of its allocation) and host memory; this process,
// with GPU memory of its own, reads the child's GPU region whole (more
// than a chunk; by a grant, asking a lease meanwhile) and, through the
// lease, as a batch of 64 scattered ranges, and writes it, through CUDA
// IPC ("ipc"), checking every byte; what it wrote is read
// back into host memory over TCP, and the child's host region, which IPC
// cannot carry, is read over TCP too. TCPOnly carries everything over
// TCP.
func TestGPUIPC(t *testing.T) {
	for _, tcpOnly := range []bool{false, true} {
		t.Run(map[bool]string{false: "ipc", true: "tcp"}[tcpOnly], func(t *testing.T) { testGPUIPC(t, tcpOnly) })
	}
}

func testGPUIPC(t *testing.T, tcpOnly bool) {
	g := gpuOrSkip(t)
	want := "ipc"
	if tcpOnly {
		want = "tcp"
	}
	const size = 5<<20 + 333
	// Copies of 1 MiB through CUDA IPC: a region crosses chunks.
	defer func(c int) { ipcChunk = c }(ipcChunk)
	ipcChunk = 1 << 20
	ld := gpuAllocFor(t, g, size)
	e, p, ctx := parentOf(t, "gpu-target", size, 21, tcpOnly)
	rg, ok1 := p.Remote("mem")
	rh, ok2 := p.Remote("host")
	if !ok1 || !ok2 {
		t.Fatal("the child's regions are not in its Info")
	}
	lr, err := e.Register("lgpu", ld)
	if err != nil {
		t.Fatal(err)
	}
	lh := make([]byte, size)
	lhr, _ := e.Register("lhost", lh)
	contents := func() []byte {
		h := make([]byte, size)
		if err := ld.CopyToHost(h); err != nil {
			t.Fatal(err)
		}
		return h
	}
	run := func(what string, f *Future, transport string) {
		t.Helper()
		if err := f.Wait(ctx); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if f.Transport() != transport {
			t.Errorf("%s: transport %q, want %q", what, f.Transport(), transport)
		}
	}
	// The child's GPU region whole.
	gw := make([]byte, size)
	fill(gw, 21)
	run("read", p.Read([]Op{{Local: lr, Remote: rg, Len: size}}), want)
	if !bytes.Equal(contents(), gw) {
		t.Fatal("the GPU region read differs")
	}
	if !tcpOnly {
		// The first read asked a lease of the region: the transfers
		// below copy through it.
		eventually(t, "the lease of the child's GPU region", func() bool {
			p.l.mu.Lock()
			defer p.l.mu.Unlock()
			ls := p.l.gpuLeases[rg.ID]
			return ls != nil && ls.ready && ls.ipc != nil
		})
	}
	// 64 scattered ranges of it, into slots of the local region.
	rng := rand.New(rand.NewPCG(5, 6))
	var ops []Op
	slot := size / 64
	for i := range 64 {
		n := 1 + rng.IntN(slot)
		ops = append(ops, Op{Local: lr, LocalOff: i * slot, Remote: rg, RemoteOff: rng.IntN(size - n), Len: n})
	}
	if err := ld.CopyFromHost(make([]byte, size)); err != nil {
		t.Fatal(err)
	}
	run("batched read", p.Read(ops), want)
	got := contents()
	for i, o := range ops {
		if !bytes.Equal(got[o.LocalOff:o.LocalOff+o.Len], gw[o.RemoteOff:o.RemoteOff+o.Len]) {
			t.Fatalf("range %d of the batch differs", i)
		}
	}
	// A write of fresh bytes, read back into host memory over TCP.
	fresh := make([]byte, size)
	fill(fresh, 23)
	if err := ld.CopyFromHost(fresh); err != nil {
		t.Fatal(err)
	}
	run("write", p.Write([]Op{{Local: lr, Remote: rg, Len: size}}), want)
	run("read back", p.Read([]Op{{Local: lhr, Remote: rg, Len: size}}), "tcp")
	if !bytes.Equal(lh, fresh) {
		t.Fatal("the GPU region written differs")
	}
	// The child's host region into GPU memory: not through IPC.
	hw := make([]byte, size)
	fill(hw, 22)
	run("read of host memory", p.Read([]Op{{Local: lr, Remote: rh, Len: size}}), "tcp")
	if !bytes.Equal(contents(), hw) {
		t.Fatal("the host region read differs")
	}
	if !tcpOnly {
		// Into host memory, the same region is leased all the same (its
		// GPU lease was refused).
		clear(lh)
		run("host read of host memory", p.Read([]Op{{Local: lhr, Remote: rh, Len: size}}), "cma")
		if !bytes.Equal(lh, hw) {
			t.Fatal("the host region read into host memory differs")
		}
		leaseReady(t, p, rh)
	}
}

// TestGPUIPCConcurrent: the first batches of a link to a child's GPU
// region, 8 reads of its slices at once (each a grant on its own
// connection, beside the region's lease being granted), all go through
// CUDA IPC and read the right bytes (the grants of the allocation share
// the link's one open of it).
func TestGPUIPCConcurrent(t *testing.T) {
	g := gpuOrSkip(t)
	const size, k = 8 << 20, 8
	ld := gpuAllocFor(t, g, size)
	e, p, ctx := parentOf(t, "gpu-target", size, 41, false)
	rg, _ := p.Remote("mem")
	lr, err := e.Register("lgpu", ld)
	if err != nil {
		t.Fatal(err)
	}
	// Every open takes a while, as a real one does (a mapping made).
	testHookIPCOpen = func() { time.Sleep(2 * time.Millisecond) }
	defer func() { testHookIPCOpen = nil }()
	futs := make([]*Future, k)
	for i := range futs {
		futs[i] = p.Read([]Op{{Local: lr, LocalOff: i * size / k, Remote: rg, RemoteOff: i * size / k, Len: size / k}})
	}
	for i, f := range futs {
		if err := f.Wait(ctx); err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		if f.Transport() != "ipc" {
			t.Errorf("read %d: transport %q, want ipc", i, f.Transport())
		}
	}
	want := make([]byte, size)
	fill(want, 41)
	got := make([]byte, size)
	if err := ld.CopyToHost(got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the slices read at once differ")
	}
}

// TestGPUIPCCancelReuse: reads of a child's GPU region through CUDA IPC
// cancelled at once or a few milliseconds in, and a cancelled write:
// once Wait has returned, the local GPU buffer, refilled, is not touched
// again (checked after a later transfer on the link); a full write after
// a cancelled one lands whole (read back over TCP); nothing is left on
// this side (parts, open allocations), and the local region deregisters
// at once. Deregistering the local region during a read fails it with
// ErrClosed.
func TestGPUIPCCancelReuse(t *testing.T) {
	g := gpuOrSkip(t)
	const size = 64 << 20
	ld := gpuAllocFor(t, g, size)
	e, p, ctx := parentOf(t, "gpu-target", size, 31, false)
	rg, _ := p.Remote("mem")
	lr, err := e.Register("lgpu", ld)
	if err != nil {
		t.Fatal(err)
	}
	mark := bytes.Repeat([]byte{0xA5}, size)
	small := make([]byte, 4096)
	sr, _ := e.Register("small", small)
	cancelled := 0
	for round := range 5 {
		f := p.Read([]Op{{Local: lr, Remote: rg, Len: size}})
		cctx, cancel := context.WithCancel(ctx)
		go func() { time.Sleep(time.Duration(round) * time.Millisecond); cancel() }()
		err := f.Wait(cctx)
		cancel()
		if err == nil {
			if f.Transport() != "ipc" {
				t.Fatalf("round %d: transport %q, want ipc", round, f.Transport())
			}
			continue // it finished first
		}
		if !errors.Is(err, ErrCancelled) {
			t.Fatalf("round %d: %v, want ErrCancelled", round, err)
		}
		cancelled++
		if err := ld.CopyFromHost(mark); err != nil {
			t.Fatal(err)
		}
		if err := p.Read([]Op{{Local: sr, Remote: rg, Len: len(small)}}).Wait(ctx); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, size)
		if err := ld.CopyToHost(got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, mark) {
			i := 0
			for got[i] == 0xA5 {
				i++
			}
			t.Fatalf("round %d: byte %d of the reused GPU buffer was written after the cancel", round, i)
		}
	}
	t.Logf("%d of 5 reads cancelled mid-way", cancelled)
	// A cancelled write, then a full one that lands whole.
	fresh := make([]byte, size)
	fill(fresh, 32)
	if err := ld.CopyFromHost(fresh); err != nil {
		t.Fatal(err)
	}
	f := p.Write([]Op{{Local: lr, Remote: rg, Len: size}})
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := f.Wait(cctx); err != nil && !errors.Is(err, ErrCancelled) {
		t.Fatal(err)
	}
	fill(fresh, 33)
	if err := ld.CopyFromHost(fresh); err != nil {
		t.Fatal(err)
	}
	if f := p.Write([]Op{{Local: lr, Remote: rg, Len: size}}); f.Wait(ctx) != nil || f.Transport() != "ipc" {
		t.Fatalf("the write after a cancelled one: %v, transport %q", f.Wait(ctx), f.Transport())
	}
	back := make([]byte, size)
	br, _ := e.Register("back", back)
	if err := p.Read([]Op{{Local: br, Remote: rg, Len: size}}).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back, fresh) {
		t.Fatal("the write after a cancelled one did not land whole")
	}
	// Deregistering the local region fails a read in flight.
	f = p.Read([]Op{{Local: lr, Remote: rg, Len: size}})
	if err := e.Deregister(ctx, lr); err != nil {
		t.Fatal(err)
	}
	if err := f.Wait(ctx); err != nil && !errors.Is(err, ErrClosed) {
		t.Fatalf("a read whose local region was deregistered: %v, want ErrClosed (or done first)", err)
	}
	eventually(t, "the transfers' state to drain", func() bool {
		p.l.mu.Lock()
		defer p.l.mu.Unlock()
		leased := 0 // allocations a lease keeps open until it is revoked
		for _, ls := range p.l.gpuLeases {
			if ls.ipc != nil {
				leased++
			}
		}
		return len(p.l.parts) == 0 && len(p.l.ipcs) <= leased
	})
}

// TestConcurrent: both ends at once, 8 goroutines each, write random
// batches into slots of the other's region and read them back, while
// sends and receives cross; every byte is checked.
func TestConcurrent(t *testing.T) { transports(t, testConcurrent) }

func testConcurrent(t *testing.T, tcpOnly bool, wantT string) {
	a, b, ab, ba := pair(t, func(o *Options) { o.TCPOnly = tcpOnly })
	ctx := ctxT(t, 60*time.Second)
	const workers, slot = 8, 1 << 20
	run := func(me *Endpoint, peer *Peer, target *Region, seed uint64) error {
		var wg sync.WaitGroup
		errs := make(chan error, workers+1)
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(seed, uint64(w)))
				src := make([]byte, slot)
				dst := make([]byte, slot)
				sr, _ := me.Register(fmt.Sprint("src", w), src) // a name is one region's at a time
				dr, _ := me.Register(fmt.Sprint("dst", w), dst)
				defer me.Deregister(ctx, sr)
				defer me.Deregister(ctx, dr)
				for round := range 10 {
					fill(src, rng.Uint64())
					var ops []Op
					for off := 0; off < slot; {
						n := min(1+rng.IntN(slot/4), slot-off)
						ops = append(ops, Op{Local: sr, LocalOff: off, Remote: target.Remote(), RemoteOff: w*slot + off, Len: n})
						off += n
					}
					if err := peer.Write(ops).Wait(ctx); err != nil {
						errs <- err
						return
					}
					clear(dst)
					f := peer.Read([]Op{{Local: dr, Remote: target.Remote(), RemoteOff: w * slot, Len: slot}})
					if err := f.Wait(ctx); err != nil {
						errs <- err
						return
					}
					if f.Transport() != wantT {
						errs <- fmt.Errorf("transport %q, want %q", f.Transport(), wantT)
						return
					}
					if !bytes.Equal(src, dst) {
						errs <- fmt.Errorf("worker %d round %d: read back differs", w, round)
						return
					}
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				msg := []byte(fmt.Sprintf("message %d from %s", i, me.Name()))
				fs := peer.Send(msg)
				buf := make([]byte, 64)
				fr := peer.Recv(buf)
				if err := fs.Wait(ctx); err != nil {
					errs <- err
					return
				}
				if err := fr.Wait(ctx); err != nil {
					errs <- err
					return
				}
				want := fmt.Sprintf("message %d from %s", i, peer.Name())
				if string(buf[:fr.Len()]) != want {
					errs <- fmt.Errorf("got %q, want %q", buf[:fr.Len()], want)
					return
				}
			}
		}()
		wg.Wait()
		close(errs)
		return <-errs
	}
	bothWays(t, a, b, ab, ba, workers*slot, run)
}

// bothWays registers a region of size bytes on a and on b, and runs run
// from both ends at once, each toward the other's region (seeds 1 and 2);
// t fails with the first error.
func bothWays(t *testing.T, a, b *Endpoint, ab, ba *Peer, size int, run func(me *Endpoint, peer *Peer, target *Region, seed uint64) error) {
	t.Helper()
	ra, _ := a.Register("region", make([]byte, size))
	rb, _ := b.Register("region", make([]byte, size))
	done := make(chan error, 2)
	go func() { done <- run(a, ab, rb, 1) }()
	go func() { done <- run(b, ba, ra, 2) }()
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// TestSmallOps: both ends at once, 4 goroutines each, write random small
// batches (1 to 8 ranges, up to about 48 KiB in all: either side of
// cmaMin and directMax) into slots of the other's region and read them
// back, over send buffers shrunk so that the frames written directly by
// the calling goroutine are often taken only in part (the rest goes to
// the connection's writer). Every byte is checked; a batch of at most
// cmaMin bytes reports tcp, a larger one the link's transport.
func TestSmallOps(t *testing.T) { transports(t, testSmallOps) }

func testSmallOps(t *testing.T, tcpOnly bool, wantT string) {
	a, b, ab, ba := pair(t, func(o *Options) { o.TCPOnly = tcpOnly })
	for _, p := range []*Peer{ab, ba} {
		for _, c := range p.l.conns {
			c.c.SetWriteBuffer(4096)
		}
	}
	ctx := ctxT(t, 60*time.Second)
	const workers, slot = 4, 64 << 10
	run := func(me *Endpoint, peer *Peer, target *Region, seed uint64) error {
		if !tcpOnly {
			// The first batch asks for a lease of the target region;
			// once it is granted every batch is copied through it, small
			// ones too (a batch without a lease goes over TCP up to
			// cmaMin bytes).
			one, _ := me.Register("one", make([]byte, 1))
			if err := peer.Write([]Op{{Local: one, Remote: target.Remote(), Len: 1}}).Wait(ctx); err != nil {
				return err
			}
			eventually(t, "the lease", func() bool {
				peer.l.mu.Lock()
				defer peer.l.mu.Unlock()
				ls := peer.l.leases[target.id]
				return ls != nil && ls.ready
			})
		}
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(seed, uint64(w)))
				src := make([]byte, slot)
				dst := make([]byte, slot)
				sr, _ := me.Register(fmt.Sprint("src", w), src)
				dr, _ := me.Register(fmt.Sprint("dst", w), dst)
				defer me.Deregister(ctx, sr)
				defer me.Deregister(ctx, dr)
				for round := range 300 {
					fill(src, rng.Uint64())
					clear(dst)
					var wops, rops []Op
					total := 0
					for off := 0; len(wops) < 1+rng.IntN(8); {
						n := 1 + rng.IntN(6000)
						if off+n > slot {
							break
						}
						wops = append(wops, Op{Local: sr, LocalOff: off, Remote: target.Remote(), RemoteOff: w*slot + off, Len: n})
						rops = append(rops, Op{Local: dr, LocalOff: off, Remote: target.Remote(), RemoteOff: w*slot + off, Len: n})
						off += n + rng.IntN(64)
						total += n
					}
					want := wantT
					fw := peer.Write(wops)
					if err := fw.Wait(ctx); err != nil {
						errs <- err
						return
					}
					fr := peer.Read(rops)
					if err := fr.Wait(ctx); err != nil {
						errs <- err
						return
					}
					if fw.Transport() != want || fr.Transport() != want {
						errs <- fmt.Errorf("%d bytes: transports %q and %q, want %q", total, fw.Transport(), fr.Transport(), want)
						return
					}
					for _, o := range wops {
						if !bytes.Equal(src[o.LocalOff:o.LocalOff+o.Len], dst[o.LocalOff:o.LocalOff+o.Len]) {
							errs <- fmt.Errorf("worker %d round %d: %d bytes at %d read back differ", w, round, o.Len, o.LocalOff)
							return
						}
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		return <-errs
	}
	bothWays(t, a, b, ab, ba, workers*slot, run)
}

// TestSharedLifecycle: Shared memory cannot be freed while a region on it
// is registered (a peer may be copying through it); once deregistered,
// or once its endpoint is closed, it can; a closed one cannot be
// registered; sizes out of range are refused.
func TestSharedLifecycle(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	for _, n := range []int{0, -1, MaxLen + 1} {
		if _, err := NewShared(n); !errors.Is(err, ErrInvalid) {
			t.Errorf("NewShared(%d): %v, want ErrInvalid", n, err)
		}
	}
	e := endpoint(t, ctx, Options{Name: "a", Auth: testAuth()})
	sh, err := NewShared(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if sh.Len() != 1<<20 || len(sh.Bytes()) != 1<<20 {
		t.Fatalf("%d bytes", sh.Len())
	}
	r, err := e.Register("m", sh)
	if err != nil {
		t.Fatal(err)
	}
	if err := sh.Close(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Close while registered: %v, want ErrInvalid", err)
	}
	sh.Bytes()[12345] = 7 // still mapped
	if err := e.Deregister(ctx, r); err != nil {
		t.Fatal(err)
	}
	if err := sh.Close(); err != nil {
		t.Fatalf("Close once deregistered: %v", err)
	}
	if sh.Bytes() != nil {
		t.Error("a closed Shared still gives its bytes")
	}
	if _, err := e.Register("m2", sh); !errors.Is(err, ErrInvalid) {
		t.Errorf("registering a closed Shared: %v, want ErrInvalid", err)
	}
	// A region of an endpoint that is closed no longer holds its memory.
	e2, err := New(ctx, Options{Name: "b", Auth: testAuth()})
	if err != nil {
		t.Fatal(err)
	}
	sh2, err := NewShared(4096)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e2.Register("m", sh2); err != nil {
		t.Fatal(err)
	}
	if err := sh2.Close(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Close while registered: %v, want ErrInvalid", err)
	}
	e2.Close()
	if err := sh2.Close(); err != nil {
		t.Fatalf("Close once the endpoint is closed: %v", err)
	}
}

// TestLeaseRevoked: on one host, batches copied through a lease ask the
// target nothing; Deregister revokes the lease and returns only once the
// copy that uses it has ended (the owner may then reuse the memory: the
// bytes read are the ones before); the region is then refused on both
// sides, and nothing of the lease is left on either.
func TestLeaseRevoked(t *testing.T) {
	a, b, ab, ba := pair(t, nil)
	ctx := ctxT(t, 60*time.Second)
	const n = 64 << 20
	sh, err := NewShared(n)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	fill(sh.Bytes(), 1)
	want := append([]byte(nil), sh.Bytes()...)
	tr, err := b.Register("t", sh)
	if err != nil {
		t.Fatal(err)
	}
	local := make([]byte, n)
	lr, _ := a.Register("l", local)
	small := []Op{{Local: lr, Remote: tr.Remote(), RemoteOff: 8, Len: 4096}}
	if err := ab.Read(small).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the lease", func() bool {
		ab.l.mu.Lock()
		defer ab.l.mu.Unlock()
		ls := ab.l.leases[tr.id]
		return ls != nil && ls.ready
	})
	f := ab.Read(small)
	if err := f.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if f.parts[0].sub != rLease || f.Transport() != "shm" || !bytes.Equal(local[:4096], want[8:8+4096]) {
		t.Fatalf("through the lease: request kind %d, transport %q, bytes equal %v", f.parts[0].sub, f.Transport(), bytes.Equal(local[:4096], want[8:8+4096]))
	}
	big := ab.Read([]Op{{Local: lr, Remote: tr.Remote(), Len: n}})
	if big.parts[0].sub != rLease {
		t.Fatalf("a large read: request kind %d, want a lease's copy", big.parts[0].sub)
	}
	if err := b.Deregister(ctx, tr); err != nil {
		t.Fatal(err)
	}
	fill(sh.Bytes(), 2) // the owner reuses its memory
	if err := big.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(local, want) {
		t.Fatal("a copy through the lease went on after Deregister returned")
	}
	refused := b.Refused()
	if err := ab.Read(small).Wait(ctx); !errors.Is(err, ErrRefused) {
		t.Fatalf("a read of the deregistered region: %v, want ErrRefused", err)
	}
	if b.Refused() != refused+1 {
		t.Fatalf("the target counted %d refusals, want %d", b.Refused(), refused+1)
	}
	eventually(t, "the lease to be gone on both sides", func() bool {
		n := 0
		for _, l := range []*link{ab.l, ba.l} {
			l.mu.Lock()
			n += len(l.grants) + len(l.leased) + len(l.leaseIDs)
			for _, m := range l.maps {
				n += m.refs
			}
			l.mu.Unlock()
		}
		return n == 0
	})
}

// TestIdleLink: a link left idle for several heartbeats (its pings the
// only traffic) stays up, and a transfer after the pause succeeds: a
// socket write deadline set by an earlier frame must not fail a later
// write made at once (direct) long after it.
func TestIdleLink(t *testing.T) { transports(t, testIdleLink) }

func testIdleLink(t *testing.T, tcpOnly bool, wantT string) {
	a, b, ab, _ := pair(t, func(o *Options) { o.TCPOnly = tcpOnly; o.Heartbeat = 200 * time.Millisecond })
	ctx := ctxT(t, 30*time.Second)
	mem := make([]byte, 1<<20)
	fill(mem, 5)
	tr, _ := b.Register("t", mem)
	local := make([]byte, 1<<20)
	lr, _ := a.Register("l", local)
	for _, n := range []int{1 << 20, 8, 1 << 20} {
		if err := ab.Read([]Op{{Local: lr, Remote: tr.Remote(), Len: n}}).Wait(ctx); err != nil {
			t.Fatalf("a read of %d bytes: %v", n, err)
		}
		time.Sleep(time.Second) // five heartbeats
		if err := ab.l.failed(); err != nil {
			t.Fatalf("the idle link failed: %v", err)
		}
	}
	if !bytes.Equal(local, mem) {
		t.Fatal("the bytes read differ")
	}
}

// TestPublishNameTaken: a name is its first publisher's. The endpoint
// that holds it publishes again (its new regions, from several goroutines
// at once); another endpoint given the same name, or a name whose key
// holds something that is not an Info, fails with ErrInvalid naming the
// holder, and peers still find the first endpoint under the name.
func TestPublishNameTaken(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	_, st := storeFor(t)
	a := published(t, ctx, st, "x", nil)
	want := make([]byte, 4096)
	fill(want, 11)
	if _, err := a.Register("r", want); err != nil {
		t.Fatal(err)
	}
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() { errs[i] = a.Publish(ctx) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("the holder publishing again: %v", err)
		}
	}
	b := endpoint(t, ctx, Options{Name: "x", Store: st, Auth: testAuth()})
	err := b.Publish(ctx)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), fmt.Sprintf("taken by another endpoint (pid %d", os.Getpid())) {
		t.Fatalf("a second endpoint named x: %v, want ErrInvalid naming the holder", err)
	}
	c := published(t, ctx, st, "c", nil)
	p, err := c.Connect(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	rr, ok := p.Remote("r")
	if !ok {
		t.Fatal("the Info under x is not the holder's (no region r)")
	}
	got := make([]byte, len(want))
	lr, _ := c.Register("l", got)
	if err := p.Read([]Op{{Local: lr, Remote: rr, Len: len(got)}}).Wait(ctx); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("reading the holder's region: %v, equal %v", err, bytes.Equal(got, want))
	}
	if err := st.Set(ctx, a.infoKey("y"), []byte("not an info")); err != nil {
		t.Fatal(err)
	}
	y := endpoint(t, ctx, Options{Name: "y", Store: st, Auth: testAuth()})
	if err := y.Publish(ctx); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "taken") {
		t.Fatalf("a name whose key holds junk: %v, want ErrInvalid", err)
	}
}

// TestRegionNames: a name is one region's at a time (Register refuses a
// name already registered, and takes it again once it is deregistered),
// and an Info with more regions than MaxInfoRegions lists the first
// registered, in order, every time.
func TestRegionNames(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	a := endpoint(t, ctx, Options{Name: "a", Auth: testAuth()})
	r, err := a.Register("kv", make([]byte, 8))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Register("kv", make([]byte, 16)); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `region "kv"`) {
		t.Fatalf("a second region named kv: %v, want ErrInvalid naming it", err)
	}
	if err := a.Deregister(ctx, r); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Register("kv", make([]byte, 16)); err != nil {
		t.Fatalf("kv again after its Deregister: %v", err)
	}
	for i := range MaxInfoRegions + 100 {
		if _, err := a.Register(fmt.Sprint("r", i), make([]byte, 8)); err != nil {
			t.Fatal(err)
		}
	}
	for range 5 {
		in, err := decodeInfo(a.Info())
		if err != nil {
			t.Fatal(err)
		}
		if len(in.regions) != MaxInfoRegions || in.regions[0].Name != "kv" {
			t.Fatalf("the Info lists %d regions, the first %q; want %d, kv first", len(in.regions), in.regions[0].Name, MaxInfoRegions)
		}
		for i, rr := range in.regions[1:] {
			if want := fmt.Sprint("r", i); rr.Name != want {
				t.Fatalf("the Info's region %d is %q, want %q (the first registered, in order)", i+1, rr.Name, want)
			}
		}
	}
}

// TestConnectGone: Connect to a peer whose published Info names an
// address where nothing listens any more fails at once, not at the
// deadline with a dial timeout: ErrPeerLost where its process was killed,
// ErrRefused where it runs (its endpoint closed).
func TestConnectGone(t *testing.T) {
	addr, st := storeFor(t)
	ctx := ctxT(t, 30*time.Second)
	a := published(t, ctx, st, "a", nil)
	b := published(t, ctx, st, "b", nil)
	b.Close()
	cmd := startChild(t, "echo", addr, 1<<10, 1)
	// The child has published once a Connect to it works.
	if _, err := a.Connect(ctx, "child"); err != nil {
		t.Fatal(err)
	}
	cmd.Process.Kill()
	cmd.Wait()
	a2 := published(t, ctx, st, "a2", nil)
	for _, tc := range []struct {
		peer     string
		sentinel error
		want     string
	}{
		{"b", ErrRefused, fmt.Sprintf("connection refused, though its process (pid %d) runs", os.Getpid())},
		{"child", ErrPeerLost, fmt.Sprintf("its process (pid %d) has exited", cmd.Process.Pid)},
	} {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		t0 := time.Now()
		_, err := a2.Connect(cctx, tc.peer)
		cancel()
		if !errors.Is(err, tc.sentinel) || !strings.Contains(err.Error(), tc.want) || time.Since(t0) > 5*time.Second {
			t.Errorf("Connect to %s, gone: %v after %v, want %v at once saying %q", tc.peer, err, time.Since(t0).Round(time.Millisecond), tc.sentinel, tc.want)
		}
	}
}

// TestRegisterBadMemory: Register of memory that is not there (nil,
// empty, a nil pointer of a kind it takes) fails with ErrInvalid naming
// the region, and does not panic; the name stays free.
func TestRegisterBadMemory(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	a := endpoint(t, ctx, Options{Name: "a", Auth: testAuth()})
	for _, tc := range []struct {
		name string
		mem  any
	}{
		{"nil", nil},
		{"empty", []byte{}},
		{"nil slice", []byte(nil)},
		{"nil Shared", (*Shared)(nil)},
		{"nil HostBuffer", (*device.HostBuffer)(nil)},
		{"nil CUDABuffer", (*device.CUDABuffer)(nil)},
	} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s: Register panicked: %v", tc.name, r)
				}
			}()
			r, err := a.Register("m", tc.mem)
			if r != nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `region "m"`) {
				t.Errorf("%s: Register: %v, %v; want ErrInvalid naming region \"m\"", tc.name, r, err)
			}
		}()
	}
	if _, err := a.Register("m", make([]byte, 8)); err != nil {
		t.Errorf("the name after the refused registrations: %v", err)
	}
}
