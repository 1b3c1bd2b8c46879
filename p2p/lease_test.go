package p2p

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
)

// sharedIov is a grant's iovec of sh whole, as its owner would send it.
func sharedIov(sh *Shared) []byte {
	iov := make([]byte, IovSize)
	binary.LittleEndian.PutUint64(iov, uint64(uintptr(unsafe.Pointer(&sh.Bytes()[0]))))
	binary.LittleEndian.PutUint64(iov[8:], uint64(sh.Len()))
	binary.LittleEndian.PutUint64(iov[16:], sh.id)
	binary.LittleEndian.PutUint32(iov[32:], uint32(sh.fd))
	return iov
}

// leaseReady waits until p holds a granted lease of the peer's region rr.
func leaseReady(t *testing.T, p *Peer, rr RemoteRegion) {
	t.Helper()
	eventually(t, "the lease of "+rr.Name, func() bool {
		p.l.mu.Lock()
		defer p.l.mu.Unlock()
		ls := p.l.leases[rr.ID]
		return ls != nil && ls.ready
	})
}

// leased has the fake target grant a lease of u's region (of plain
// memory, pages a userfaultfd holds back), refusing the read that asked
// it, and waits until the lease is ready.
func leased(t *testing.T, u uffdTarget) {
	t.Helper()
	f := u.p.Read([]Op{{Local: u.lr, Remote: u.rr, Len: 1 << 16}})
	h := sameHostRequest(t, u.c, u.iov) // the lease granted; the read itself refused
	u.c.Write(hdr(header{kind: kResp, sub: h.sub, id: h.id, status: stKey}))
	f.Wait(u.ctx)
	leaseReady(t, u.p, u.rr)
}

// TestLeaseProcessVMNotInline: a copy through a lease of plain memory
// (process_vm), which the peer can make wait on its pages (here held back
// by a userfaultfd), runs in a goroutine of its own: the call returns at
// once, and the copy completes once the pages come.
func TestLeaseProcessVMNotInline(t *testing.T) {
	u := newUffdTarget(t)
	leased(t, u)
	ctx, p, lr, rr, pages := u.ctx, u.p, u.lr, u.rr, u.pages
	var f *Future
	done := make(chan *Future, 1)
	go func() { done <- p.Read([]Op{{Local: lr, Remote: rr, Len: 8}}) }()
	select {
	case f = <-done:
	case <-time.After(2 * time.Second):
		pages()
		<-done
		t.Fatal("an 8-byte read through a lease of pages that wait did not return within 2 s")
	}
	pages()
	if err := f.Wait(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestLeaseHugeSize: a RemoteRegion whose size the target would not take
// (made up by the caller) is not asked a lease of (its request would
// break the protocol and end the link): the batch goes the usual way,
// where the target checks its range against the region, and the link
// goes on.
func TestLeaseHugeSize(t *testing.T) {
	a, b, ab, _ := pair(t, nil)
	ctx := ctxT(t, 30*time.Second)
	tr, _ := b.Register("t", make([]byte, 4096))
	lr, _ := a.Register("l", make([]byte, 4096))
	bad := tr.Remote()
	bad.Size = MaxLen + 1
	if err := ab.Read([]Op{{Local: lr, Remote: bad, Len: 64}}).Wait(ctx); err != nil {
		t.Fatalf("a read inside the region, its size made up: %v", err)
	}
	ab.l.mu.Lock()
	asked := ab.l.leases[tr.id] != nil
	ab.l.mu.Unlock()
	if asked {
		t.Fatal("a lease was asked for a region of a made-up size")
	}
	if err := ab.Read([]Op{{Local: lr, Remote: tr.Remote(), Len: 64}}).Wait(ctx); err != nil {
		t.Fatalf("a good read afterwards: %v", err)
	}
}

// leasedWriters writes ops through p once, waits for the lease of their
// region (ops name one), and starts writers.
func leasedWriters(t *testing.T, ctx context.Context, p *Peer, ops []Op, src []byte) (chan struct{}, *atomic.Int64, *sync.WaitGroup) {
	t.Helper()
	if err := p.Write(ops).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	leaseReady(t, p, ops[0].Remote)
	stop := make(chan struct{})
	ok := new(atomic.Int64)
	return stop, ok, writers(p, ops, src, stop, ok)
}

// writers writes ops through p, with a new value in src each time, until
// stop is closed, counting the writes that succeeded.
func writers(p *Peer, ops []Op, src []byte, stop chan struct{}, ok *atomic.Int64) *sync.WaitGroup {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := uint64(1); ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			binary.LittleEndian.PutUint64(src, i)
			if p.Write(ops).Wait(context.Background()) == nil {
				ok.Add(1)
			}
		}
	}()
	return &wg
}

// TestLeaseWriteAfterDeregister: writes through a lease that run while
// the target deregisters the region are over when Deregister returns:
// its memory does not change after.
func TestLeaseWriteAfterDeregister(t *testing.T) {
	a, b, ab, _ := pair(t, nil)
	ctx := ctxT(t, 30*time.Second)
	for round := range 10 {
		buf := make([]byte, 4096)
		tr, _ := b.Register("t", buf)
		src := make([]byte, 16)
		lr, _ := a.Register("l", src)
		ops := []Op{{Local: lr, Remote: tr.Remote(), Len: 8}, {Local: lr, LocalOff: 8, Remote: tr.Remote(), RemoteOff: 8, Len: 8}}
		stop, _, wg := leasedWriters(t, ctx, ab, ops, src)
		time.Sleep(5 * time.Millisecond)
		if err := b.Deregister(ctx, tr); err != nil {
			t.Fatal(err)
		}
		snap := append([]byte(nil), buf...)
		time.Sleep(20 * time.Millisecond)
		close(stop)
		wg.Wait()
		if !bytes.Equal(snap, buf) {
			t.Fatalf("round %d: the region changed after Deregister returned", round)
		}
		a.Deregister(ctx, lr)
	}
}

// TestLeaseWriteAfterClose: writes through a lease that run while the
// target closes its endpoint are over when Close returns: the memory of
// its regions (plain memory, which it may free) does not change after.
func TestLeaseWriteAfterClose(t *testing.T) {
	for round := range 4 {
		a, b, ab, _ := pair(t, nil)
		ctx := ctxT(t, 30*time.Second)
		buf := make([]byte, 4096)
		tr, _ := b.Register("t", buf)
		src := make([]byte, 8)
		lr, _ := a.Register("l", src)
		ops := []Op{{Local: lr, Remote: tr.Remote(), Len: 8}}
		stop, ok, wg := leasedWriters(t, ctx, ab, ops, src)
		time.Sleep(20 * time.Millisecond)
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		after := ok.Load()
		snap := append([]byte(nil), buf...)
		time.Sleep(100 * time.Millisecond)
		close(stop)
		wg.Wait()
		if !bytes.Equal(snap, buf) {
			t.Fatalf("round %d: the memory changed after Close returned (%d writes succeeded after)", round, ok.Load()-after)
		}
	}
}

// deregisterSoon deregisters r, failing the test unless it returns within
// 2 s (well within the heartbeat it would otherwise wait for).
func deregisterSoon(t *testing.T, ctx context.Context, e *Endpoint, r *Region, what string) {
	t.Helper()
	start := time.Now()
	if err := e.Deregister(ctx, r); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Deregister %s took %v", what, d)
	}
}

// TestDeregisterAfterPeerKilled: a peer process killed while it holds a
// lease (a child reading this side's region in a loop) releases it with
// its exit: Deregister does not wait a heartbeat for it.
func TestDeregisterAfterPeerKilled(t *testing.T) {
	addr, st := storeFor(t)
	ctx := ctxT(t, 60*time.Second)
	e := endpoint(t, ctx, Options{Name: "parent", Store: st, Auth: testAuth(), Heartbeat: 10 * time.Second})
	r, _ := e.Register("mem", make([]byte, 1<<20))
	if err := e.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	cmd := startChild(t, "reader", addr, 1, 1) // the child's heartbeat: 3 s
	eventually(t, "the child's lease", func() bool {
		p := e.Peer("child")
		if p == nil {
			return false
		}
		p.l.mu.Lock()
		defer p.l.mu.Unlock()
		return len(p.l.leased) > 0
	})
	cmd.Process.Kill()
	cmd.Wait()
	deregisterSoon(t, ctx, e, r, "after the peer was killed (the link's heartbeat is 3 s)")
}

// TestLeaseAnsweredTwice: a hostile target that answers a lease twice,
// on both connections at once, breaks the protocol: the link fails, and
// no mapping is left behind (each answer would otherwise map the memory
// and one reference would never be dropped). Regions are asked one after
// another until the link fails, so that the two answers race.
func TestLeaseAnsweredTwice(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	a := endpoint(t, ctx, Options{Name: "a", Auth: testAuth(), Channels: 2})
	const n = 1 << 16
	sh, err := NewShared(n)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	var regions []RemoteRegion
	for i := range 64 {
		regions = append(regions, RemoteRegion{Name: "m", ID: uint64(i + 1), Key: 2, Size: n})
	}
	p, cs := fakeSameHostTargetN(t, ctx, a, regions, 2)
	lr, _ := a.Register("l", make([]byte, n))
	iov := sharedIov(sh)
	for _, rr := range regions {
		p.Read([]Op{{Local: lr, Remote: rr, Len: 8}}) // small: over TCP, after a lease request
		var lease header
		for _, c := range cs {
			c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			for {
				var b [HeaderSize]byte
				if _, err := readFull(c, b[:]); err != nil {
					break
				}
				h, _ := decodeHeader(b[:])
				readFull(c, make([]byte, h.payload))
				if h.kind == kReq && h.sub == rLease {
					lease = h
				}
			}
		}
		if lease.kind != kReq {
			t.Fatalf("region %d: no lease request", rr.ID)
		}
		fr := append(hdr(header{kind: kResp, sub: rLease, id: lease.id, b: 1, payload: IovSize}), iov...)
		done := make(chan struct{})
		go func() { cs[1].Write(fr); close(done) }()
		cs[0].Write(fr)
		<-done
		time.Sleep(20 * time.Millisecond)
		if p.l.failed() != nil {
			break
		}
	}
	if p.l.failed() == nil {
		t.Fatal("the link took every lease answered twice")
	}
	eventually(t, "the link's end to unmap the leases' memory", func() bool {
		p.l.mu.Lock()
		defer p.l.mu.Unlock()
		return len(p.l.maps) == 0 && a.mapCount.Load() == 0
	})
}

// TestLeaseAnsweredAfterGiveBack: a lease whose answer comes after this
// side gave its leases back (its Close's first step) is given back too:
// released to the target, and its mapping unmapped.
func TestLeaseAnsweredAfterGiveBack(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	a, err := New(ctx, Options{Name: "a", Auth: testAuth(), Channels: 1})
	if err != nil {
		t.Fatal(err)
	}
	const n = 1 << 16
	sh, err := NewShared(n)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	rr := RemoteRegion{Name: "m", ID: 1, Key: 2, Size: n}
	p, c := fakeSameHostTarget(t, ctx, a, rr)
	lr, _ := a.Register("l", make([]byte, n))
	iov := sharedIov(sh)
	p.Read([]Op{{Local: lr, Remote: rr, Len: 8}}) // asks a lease, then reads over TCP
	h, _ := nextFrame(t, c)
	if h.kind != kReq || h.sub != rLease {
		t.Fatalf("got %+v, want a lease request", h)
	}
	p.l.giveBackLeases()
	c.Write(append(hdr(header{kind: kResp, sub: rLease, id: h.id, b: 1, payload: IovSize}), iov...))
	released := false
	c.SetReadDeadline(time.Now().Add(time.Second))
	for !released {
		var b [HeaderSize]byte
		if _, err := readFull(c, b[:]); err != nil {
			break
		}
		f, _ := decodeHeader(b[:])
		readFull(c, make([]byte, f.payload))
		released = f.kind == kRelease && f.id == h.id
	}
	if !released {
		t.Error("the lease answered after it was given back was never released to the target")
	}
	a.Close()
	p.l.mu.Lock()
	maps := len(p.l.maps)
	p.l.mu.Unlock()
	if maps != 0 || a.mapCount.Load() != 0 {
		t.Errorf("after Close: %d mappings on the link, %d in the endpoint", maps, a.mapCount.Load())
	}
}

// TestCloseBothLeased: two endpoints that lease each other's regions
// close at once. Each takes the other's leases back (Deregister's revoke)
// while giving its own back; the releases must reach the other side
// before the link ends (whichever connection's end it reads first), so
// that neither Close waits out the heartbeat for memory the other has
// released already.
func TestCloseBothLeased(t *testing.T) {
	const hb = 20 * time.Second
	for i := range 8 {
		a, b, ab, ba := pair(t, func(o *Options) { o.Heartbeat = hb })
		ctx := ctxT(t, 60*time.Second)
		ra, _ := a.Register(fmt.Sprint("ra", i), make([]byte, 1<<20))
		rb, _ := b.Register(fmt.Sprint("rb", i), make([]byte, 1<<20))
		for range 3 { // the first asks the lease, the later ones use it
			if err := ab.Read([]Op{{Local: ra, Remote: rb.Remote(), Len: 1 << 20}}).Wait(ctx); err != nil {
				t.Fatal(err)
			}
			if err := ba.Read([]Op{{Local: rb, Remote: ra.Remote(), Len: 1 << 20}}).Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}
		took := make([]time.Duration, 2)
		var wg sync.WaitGroup
		for j, e := range []*Endpoint{a, b} {
			wg.Go(func() {
				t0 := time.Now()
				if err := e.Close(); err != nil {
					t.Errorf("round %d: Close: %v", i, err)
				}
				took[j] = time.Since(t0)
			})
		}
		wg.Wait()
		if took[0] > hb/2 || took[1] > hb/2 {
			t.Fatalf("round %d: Close took %v and %v: one waited out the heartbeat for a lease the other had given back", i, took[0], took[1])
		}
	}
}

// TestGiveBackWithoutLeases: Close gives a link's leases back and waits
// for its writers to send the releases; a link that leased nothing (over
// TCP here, its writer busy with a write the peer does not read) has
// nothing to send, and Close does not wait for its writer.
func TestGiveBackWithoutLeases(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	e := endpoint(t, ctx, Options{Name: "a", Auth: testAuth(), Channels: 1, TCPOnly: true, Heartbeat: 2 * time.Second})
	p, _, rr := fakeTarget(t, e)
	lr, _ := e.Register("l", make([]byte, 1<<20))
	for range 32 { // more than the sockets hold: the writer stays busy
		p.Write([]Op{{Local: lr, Remote: rr, Len: 1 << 20}})
	}
	eventually(t, "the writer to be busy", func() bool {
		c := p.l.conns[0]
		c.qmu.Lock()
		defer c.qmu.Unlock()
		return c.busy
	})
	t0 := time.Now()
	p.l.giveBackLeases()
	if d := time.Since(t0); d > 500*time.Millisecond {
		t.Fatalf("giving back no leases took %v: it waited for the busy writer", d)
	}
}
