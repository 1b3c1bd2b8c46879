package p2p

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"
)

// misuseCheck fails t unless err wraps sentinel and its text holds each
// of want.
func misuseCheck(t *testing.T, what string, err, sentinel error, want ...string) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Errorf("%s: %v, want %v", what, err, sentinel)
		return
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: %v, want it to say %q", what, err, w)
		}
	}
}

// TestMisuseOps: odd arguments to the one-sided calls fail at once with
// ErrInvalid and never panic.
func TestMisuseOps(t *testing.T) {
	a, b, ab, _ := pair(t, nil)
	ctx := ctxT(t, 20*time.Second)
	lr, _ := a.Register("l", make([]byte, 100))
	tr, _ := b.Register("t", make([]byte, 100))
	big := make([]Op, 100000)
	for i := range big {
		big[i] = Op{Local: lr, Remote: tr.Remote(), Len: 1}
	}
	rr := tr.Remote()
	maxRR := rr
	maxRR.Size = math.MaxUint64
	for _, tc := range []struct {
		name string
		ops  []Op
	}{
		{"100k", big},
		{"empty slice", []Op{}},
		{"len maxint", []Op{{Local: lr, Remote: rr, Len: math.MaxInt}}},
		{"loff maxint", []Op{{Local: lr, LocalOff: math.MaxInt, Remote: rr, Len: 1}}},
		{"loff minint", []Op{{Local: lr, LocalOff: math.MinInt, Remote: rr, Len: 1}}},
		{"roff maxint", []Op{{Local: lr, Remote: rr, RemoteOff: math.MaxInt, Len: 1}}},
		{"roff minint", []Op{{Local: lr, Remote: rr, RemoteOff: math.MinInt, Len: 1}}},
		{"remote size max, len huge", []Op{{Local: lr, Remote: maxRR, RemoteOff: MaxLen, Len: math.MaxInt}}},
		{"remote size max, off at MaxLen", []Op{{Local: lr, Remote: maxRR, RemoteOff: MaxLen, Len: 100}}},
		{"zero region", []Op{{Local: &Region{}, Remote: rr, Len: 1}}},
		{"zero remote", []Op{{Local: lr, Remote: RemoteRegion{}, Len: 1}}},
	} {
		for ci, call := range []func([]Op) *Future{ab.Read, ab.Write, func(o []Op) *Future { return ab.WriteWithImm(o, 1) }} {
			if ci == 2 && len(tc.ops) == 0 {
				// WriteWithImm of no operations is the immediate alone
				// (TestWriteWithImm/alone), not a misuse.
				continue
			}
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Errorf("%s: panic %v", tc.name, r)
					}
				}()
				err := call(tc.ops).Wait(ctx)
				if tc.name == "remote size max, off at MaxLen" {
					// Within a made-up size: the target refuses it.
					if !errors.Is(err, ErrRefused) && !errors.Is(err, ErrInvalid) {
						t.Errorf("%s: %v", tc.name, err)
					}
					return
				}
				misuseCheck(t, tc.name, err, ErrInvalid, `peer "b"`)
			}()
		}
	}
	if err := ab.Write([]Op{{Local: lr, Remote: rr, Len: 100}}).Wait(ctx); err != nil {
		t.Fatalf("the link after: %v", err)
	}
}

// TestMisuseRegister: registrations a careless user makes.
func TestMisuseRegister(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	a := endpoint(t, ctx, Options{Name: "a", Auth: testAuth()})
	b := endpoint(t, ctx, Options{Name: "b", Auth: testAuth()})
	mem := make([]byte, 64)
	r1, err := a.Register("one", mem)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := a.Register("two", mem[8:40]) // overlapping the first
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Register(strings.Repeat("x", 10<<10), mem); !errors.Is(err, ErrInvalid) {
		t.Errorf("a 10 KB name: %v", err)
	} else if len(err.Error()) > 400 {
		t.Errorf("a 10 KB name: the error is %d bytes long: %.200s...", len(err.Error()), err)
	}
	if _, err := a.Register("a\nb\x00c", mem); !errors.Is(err, ErrInvalid) {
		t.Errorf("a name with NUL: %v", err)
	}
	if _, err := a.Register("x/y", mem); !errors.Is(err, ErrInvalid) {
		t.Errorf("a name with /: %v", err)
	}
	if _, err := a.Register("\xff", mem); !errors.Is(err, ErrInvalid) {
		t.Errorf("a name not UTF-8: %v", err)
	}
	if r, err := a.Register("nl\nname", mem); err == nil {
		_ = r
	}
	if err := b.Deregister(ctx, r1); !errors.Is(err, ErrInvalid) {
		t.Errorf("Deregister of another endpoint's region: %v", err)
	}
	if err := a.Deregister(ctx, nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("Deregister nil: %v", err)
	}
	if err := a.Deregister(ctx, &Region{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Deregister of a zero Region: %v", err)
	}
	if err := a.Deregister(ctx, r1); err != nil {
		t.Fatal(err)
	}
	r3, err := a.Register("one", mem)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Deregister(ctx, r1); err != nil { // twice
		t.Errorf("Deregister twice: %v", err)
	}
	// The second Deregister of r1 must not have withdrawn r3, which holds
	// its name now.
	if _, err := a.Register("one", mem); !errors.Is(err, ErrInvalid) {
		t.Errorf("the name of r3 after r1's second Deregister: %v", err)
	}
	in, _ := decodeInfo(a.Info())
	found := false
	for _, rr := range in.regions {
		found = found || rr.ID == r3.id
	}
	if !found {
		t.Errorf("r3 is not in the Info after r1's second Deregister")
	}
	_ = r2
	a.Close()
	if _, err := a.Register("late", mem); !errors.Is(err, ErrClosed) {
		t.Errorf("Register after Close: %v", err)
	}
	if err := a.Deregister(ctx, r2); err != nil {
		t.Errorf("Deregister after Close: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Errorf("Close twice: %v", err)
	}
}

// TestMisuseAfterClose: every call on a closed endpoint's peer fails at
// once with ErrClosed, naming the peer.
func TestMisuseAfterClose(t *testing.T) {
	a, b, ab, _ := pair(t, nil)
	ctx := ctxT(t, 20*time.Second)
	lr, _ := a.Register("l", make([]byte, 100))
	tr, _ := b.Register("t", make([]byte, 100))
	pending := []*Future{ab.Recv(make([]byte, 10)), ab.Recv(make([]byte, 10))}
	a.Close()
	for i, f := range pending {
		misuseCheck(t, "a pending receive", f.Wait(ctx), ErrClosed, `peer "b"`)
		_ = i
	}
	op := []Op{{Local: lr, Remote: tr.Remote(), Len: 10}}
	for name, f := range map[string]*Future{
		"read":  ab.Read(op),
		"write": ab.Write(op),
		"imm":   ab.WriteWithImm(op, 3),
		"send":  ab.Send([]byte("x")),
		"recv":  ab.Recv(make([]byte, 1)),
	} {
		t0 := time.Now()
		err := f.Wait(ctx)
		misuseCheck(t, name+" after Close", err, ErrClosed, `peer "b"`, "p2p: "+map[string]string{"imm": "writeimm"}[name])
		if time.Since(t0) > time.Second {
			t.Errorf("%s after Close took %v", name, time.Since(t0))
		}
	}
	if _, err := a.Imm(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Imm after Close: %v", err)
	}
	if _, err := ab.Imm(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Peer.Imm after Close: %v", err)
	}
	if _, err := a.Connect(ctx, "b"); !errors.Is(err, ErrClosed) {
		t.Errorf("Connect after Close: %v", err)
	}
	if err := a.Publish(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Publish after Close: %v", err)
	}
}

// TestMisuseWait: Wait twice, at once from two goroutines, with a done
// context, on a nil Future.
func TestMisuseWait(t *testing.T) {
	for _, tcp := range []bool{true, false} {
		_, b, ab, _ := pair(t, func(o *Options) { o.TCPOnly = tcp })
		a := ab.e
		ctx := ctxT(t, 60*time.Second)
		const size = 4 << 20
		tmem := make([]byte, size)
		fill(tmem, 5)
		tr, _ := b.Register("t", tmem)
		lmem := make([]byte, size)
		lr, _ := a.Register("l", lmem)
		for round := range 5 {
			f := ab.Read([]Op{{Local: lr, Remote: tr.Remote(), Len: size}})
			cctx, cancel := context.WithCancel(ctx)
			var wg sync.WaitGroup
			errs := make([]error, 3)
			wg.Add(3)
			go func() { defer wg.Done(); errs[0] = f.Wait(ctx) }()
			go func() { defer wg.Done(); errs[1] = f.Wait(cctx) }()
			go func() { defer wg.Done(); errs[2] = f.Wait(ctx) }()
			time.Sleep(time.Duration(round%4) * time.Millisecond)
			cancel()
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("round %d: concurrent Waits hang", round)
			}
			// All three see the same outcome.
			if (errs[0] == nil) != (errs[1] == nil) || (errs[0] == nil) != (errs[2] == nil) {
				t.Errorf("round %d: Waits disagree: %v / %v / %v", round, errs[0], errs[1], errs[2])
			}
			if errs[1] != nil && !errors.Is(errs[1], ErrCancelled) {
				t.Errorf("round %d: %v", round, errs[1])
			}
			scribble(lmem, 0x5a)
			if err := f.Wait(ctx); (err == nil) != (errs[0] == nil) {
				t.Errorf("round %d: a later Wait: %v, the first %v", round, err, errs[0])
			}
			time.Sleep(5 * time.Millisecond)
			if errs[0] != nil {
				if i := untouched(lmem, 0x5a); i >= 0 {
					t.Fatalf("round %d: byte %d written after the Wait", round, i)
				}
			}
		}
	}
	var nf *Future
	if err := nf.Wait(context.Background()); !errors.Is(err, ErrInvalid) {
		t.Errorf("nil Future: %v", err)
	}
}

// TestMisuseSendRecv: sends of zero bytes, a receive of nil, receives
// posted when the peer closes.
func TestMisuseSendRecv(t *testing.T) {
	_, b, ab, ba := pair(t, nil)
	ctx := ctxT(t, 20*time.Second)
	fs := ab.Send(nil)
	fr := ba.Recv(nil)
	if err := fs.Wait(ctx); err != nil {
		t.Errorf("send of nothing: %v", err)
	}
	if err := fr.Wait(ctx); err != nil || fr.Len() != 0 {
		t.Errorf("recv into nil: %v, %d", err, fr.Len())
	}
	fs = ab.Send([]byte{})
	buf := make([]byte, 10)
	fr = ba.Recv(buf)
	if err := fs.Wait(ctx); err != nil {
		t.Errorf("send of 0 bytes: %v", err)
	}
	if err := fr.Wait(ctx); err != nil || fr.Len() != 0 {
		t.Errorf("recv of 0 bytes: %v, %d", err, fr.Len())
	}
	fs = ab.Send([]byte("x"))
	fr = ba.Recv(nil)
	misuseCheck(t, "send of 1 into nil (send)", fs.Wait(ctx), ErrRefused, `peer "b"`)
	misuseCheck(t, "send of 1 into nil (recv)", fr.Wait(ctx), ErrRefused, `peer "a"`)
	// Then the sequence goes on.
	fs = ab.Send([]byte("y"))
	fr = ba.Recv(buf)
	if err := fs.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := fr.Wait(ctx); err != nil || fr.Len() != 1 || buf[0] != 'y' {
		t.Fatalf("after: %v %d %q", err, fr.Len(), buf[:1])
	}
	var fsr []*Future
	for range 100 {
		fsr = append(fsr, ab.Recv(make([]byte, 10)))
	}
	t0 := time.Now()
	b.Close()
	for i, f := range fsr {
		err := f.Wait(ctx)
		if !errors.Is(err, ErrPeerLost) && !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), `peer "b"`) || !strings.Contains(err.Error(), "recv") {
			t.Fatalf("receive %d when the peer closed: %v", i, err)
		}
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Errorf("the receives took %v to fail", d)
	}
}

// TestMisuseSendCancelReuse: a large send or receive whose Wait is
// cancelled mid-transfer: its buffer is the caller's at once (the race
// detector sees a late read or write; the receive's buffer is checked).
func TestMisuseSendCancelReuse(t *testing.T) {
	_, _, ab, ba := pair(t, nil)
	ctx := ctxT(t, 60*time.Second)
	const size = 16 << 20
	sbuf := make([]byte, size)
	rbuf := make([]byte, size)
	for round := range 6 {
		fs := ab.Send(sbuf)
		fr := ba.Recv(rbuf)
		cctx, cancel := context.WithCancel(ctx)
		go func() { time.Sleep(time.Duration(round) * time.Millisecond); cancel() }()
		var errS, errR error
		if round%2 == 0 {
			errR = fr.Wait(cctx)
			scribble(rbuf, 0xA5)
			errS = fs.Wait(ctx)
		} else {
			errS = fs.Wait(cctx)
			for i := range sbuf {
				sbuf[i] = byte(round)
			}
			errR = fr.Wait(ctx)
		}
		cancel()
		t.Logf("round %d: send %v, recv %v", round, errS, errR)
		if round%2 == 0 && errR != nil {
			time.Sleep(20 * time.Millisecond)
			if i := untouched(rbuf, 0xA5); i >= 0 {
				t.Fatalf("round %d: byte %d of the receive's buffer written after its Wait", round, i)
			}
		}
		// The pair after.
		fs = ab.Send([]byte("ok"))
		small := make([]byte, 2)
		fr = ba.Recv(small)
		if err := fs.Wait(ctx); err != nil {
			t.Fatalf("round %d: next send: %v", round, err)
		}
		if err := fr.Wait(ctx); err != nil || string(small) != "ok" {
			t.Fatalf("round %d: next recv: %v %q", round, err, small)
		}
	}
}

// TestMisuseConnect: Connect to itself, to a name never published, with a
// done context, twice at once.
func TestMisuseConnect(t *testing.T) {
	_, st := storeFor(t)
	ctx := ctxT(t, 30*time.Second)
	a := published(t, ctx, st, "a", nil)
	b := published(t, ctx, st, "b", nil)
	if _, err := a.Connect(ctx, "a"); !errors.Is(err, ErrInvalid) {
		t.Errorf("Connect to itself: %v", err)
	}
	if _, err := a.ConnectInfo(ctx, a.Info()); !errors.Is(err, ErrInvalid) {
		t.Errorf("ConnectInfo to itself: %v", err)
	}
	if _, err := a.ConnectInfo(ctx, nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("ConnectInfo(nil): %v", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	t0 := time.Now()
	_, err := a.Connect(cctx, "nobody")
	cancel()
	misuseCheck(t, "Connect to nobody", err, ErrTimeout, `peer "nobody"`)
	if time.Since(t0) > 2*time.Second {
		t.Errorf("Connect to nobody took %v", time.Since(t0))
	}
	cctx, cancel = context.WithCancel(ctx)
	cancel()
	_, err = a.Connect(cctx, "nobody")
	misuseCheck(t, "Connect to nobody, cancelled", err, ErrCancelled, `peer "nobody"`)
	_, err = a.Connect(cctx, "b")
	if err != nil && !errors.Is(err, ErrCancelled) {
		t.Errorf("Connect to b, cancelled: %v", err)
	}
	if _, err := a.Connect(ctx, ""); !errors.Is(err, ErrInvalid) {
		t.Errorf("Connect to empty: %v", err)
	}
	if _, err := a.Connect(ctx, strings.Repeat("z", 10<<10)); !errors.Is(err, ErrInvalid) || len(err.Error()) > 400 {
		t.Errorf("Connect to a 10 KB name: %.300v", err)
	}
	var wg sync.WaitGroup
	ps := make([]*Peer, 8)
	errs := make([]error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%2 == 0 {
				ps[i], errs[i] = a.Connect(ctx, "b")
			} else {
				ps[i], errs[i] = b.Connect(ctx, "a")
			}
		}()
	}
	wg.Wait()
	for i := range 8 {
		if errs[i] != nil {
			t.Fatalf("Connect %d: %v", i, errs[i])
		}
		if ps[i] != ps[i%2] {
			t.Errorf("Connect %d: another Peer", i)
		}
	}
	lr, _ := a.Register("l", make([]byte, 10))
	tr, _ := b.Register("t", bytes.Repeat([]byte("q"), 10))
	if err := ps[0].Read([]Op{{Local: lr, Remote: tr.Remote(), Len: 10}}).Wait(ctx); err != nil || string(lr.Bytes()) != "qqqqqqqqqq" {
		t.Fatalf("read on the shared link: %v", err)
	}
}

// TestMisuseDeregisterNoLateWrite: a region deregistered while transfers
// on it are in flight is not written once Deregister has returned: the
// target's region under peers' writes, and the initiator's under its own
// reads.
func TestMisuseDeregisterNoLateWrite(t *testing.T) { transports(t, testMisuseDeregisterNoLateWrite) }

func testMisuseDeregisterNoLateWrite(t *testing.T, tcpOnly bool, wantT string) {
	misuseDeregisterNoLateWrite(t, tcpOnly, false)
}

// TestMisuseDeregisterNoLateWriteShared: the same with the target's
// region in Shared memory (the initiator copies through its own mapping).
func TestMisuseDeregisterNoLateWriteShared(t *testing.T) {
	misuseDeregisterNoLateWrite(t, false, true)
}

func misuseDeregisterNoLateWrite(t *testing.T, tcpOnly, shared bool) {
	a, b, ab, _ := pair(t, func(o *Options) { o.TCPOnly = tcpOnly })
	ctx := ctxT(t, 60*time.Second)
	const size = 4 << 20
	for round := range 4 {
		var tmem []byte
		var tr *Region
		if shared {
			sh, err := NewShared(size)
			if err != nil {
				t.Fatal(err)
			}
			defer sh.Close()
			tmem = sh.Bytes()
			tr, _ = b.Register("t", sh)
		} else {
			tmem = make([]byte, size)
			tr, _ = b.Register("t", tmem)
		}
		src := make([]byte, size)
		fill(src, uint64(round))
		sr, _ := a.Register("s", src)
		var fs []*Future
		for i := range 4 {
			if i%2 == 0 {
				fs = append(fs, ab.Write([]Op{{Local: sr, Remote: tr.Remote(), Len: size}}))
			} else {
				fs = append(fs, ab.Write([]Op{{Local: sr, LocalOff: 1, Remote: tr.Remote(), Len: size - 1}}))
			}
		}
		time.Sleep(time.Duration(round) * time.Millisecond)
		if err := b.Deregister(ctx, tr); err != nil {
			t.Fatalf("round %d: target Deregister: %v", round, err)
		}
		scribble(tmem, 0x77)
		for _, f := range fs {
			f.Wait(ctx)
		}
		time.Sleep(10 * time.Millisecond)
		if i := untouched(tmem, 0x77); i >= 0 {
			t.Fatalf("round %d: the target's byte %d written after Deregister returned", round, i)
		}
		// The initiator's region under reads.
		tsrc := make([]byte, size)
		fill(tsrc, 99)
		tr2, _ := b.Register("t2", tsrc)
		lmem := make([]byte, size)
		lr, _ := a.Register("l", lmem)
		fs = fs[:0]
		for range 3 {
			fs = append(fs, ab.Read([]Op{{Local: lr, Remote: tr2.Remote(), Len: size}}))
		}
		time.Sleep(time.Duration(round) * time.Millisecond)
		if err := a.Deregister(ctx, lr); err != nil {
			t.Fatalf("round %d: local Deregister: %v", round, err)
		}
		scribble(lmem, 0x66)
		for _, f := range fs {
			if err := f.Wait(ctx); err != nil && !errors.Is(err, ErrClosed) {
				t.Errorf("round %d: a read into a region deregistered: %v", round, err)
			} else if err != nil && !strings.Contains(err.Error(), `"l"`) {
				t.Errorf("round %d: %v does not name the local region", round, err)
			}
		}
		time.Sleep(10 * time.Millisecond)
		if i := untouched(lmem, 0x66); i >= 0 {
			t.Fatalf("round %d: the initiator's byte %d written after Deregister returned", round, i)
		}
		a.Deregister(ctx, sr)
		b.Deregister(ctx, tr2)
	}
}

// TestMisuseCloseDuringWait: Close while Waits are parked on its
// transfers: each Wait returns ErrClosed promptly, naming the peer and the
// call, and nothing writes the buffers after Close returned.
func TestMisuseCloseDuringWait(t *testing.T) { transports(t, testMisuseCloseDuringWait) }

func testMisuseCloseDuringWait(t *testing.T, tcpOnly bool, wantT string) {
	a, b, ab, _ := pair(t, func(o *Options) { o.TCPOnly = tcpOnly })
	ctx := ctxT(t, 60*time.Second)
	const size = 8 << 20
	tmem := make([]byte, size)
	fill(tmem, 1)
	tr, _ := b.Register("t", tmem)
	lmem := make([]byte, size)
	lr, _ := a.Register("l", lmem)
	rbuf := make([]byte, 100)
	var fs []*Future
	for range 3 {
		fs = append(fs, ab.Read([]Op{{Local: lr, Remote: tr.Remote(), Len: size}}))
	}
	fs = append(fs, ab.Recv(rbuf))
	errs := make(chan error, len(fs))
	for _, f := range fs {
		go func() { errs <- f.Wait(ctx) }()
	}
	time.Sleep(2 * time.Millisecond)
	var cwg sync.WaitGroup
	for range 3 {
		cwg.Add(1)
		go func() { defer cwg.Done(); a.Close() }()
	}
	cwg.Wait()
	scribble(lmem, 0x11)
	for range fs {
		select {
		case err := <-errs:
			if err != nil && !errors.Is(err, ErrClosed) {
				t.Errorf("a Wait at Close: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a Wait did not return after Close")
		}
	}
	time.Sleep(10 * time.Millisecond)
	if i := untouched(lmem, 0x11); i >= 0 {
		t.Fatalf("byte %d written after Close returned", i)
	}
}

// TestMisuseCancelStress: goroutines read small and medium ranges, each
// into its own slot, cancelling at random; a cancelled slot is refilled by
// the caller and must keep the caller's bytes; a read that succeeded has
// the target's bytes.
func TestMisuseCancelStress(t *testing.T) { transports(t, testMisuseCancelStress) }

func testMisuseCancelStress(t *testing.T, tcpOnly bool, wantT string) {
	_, b, ab, ba := pair(t, func(o *Options) { o.TCPOnly = tcpOnly })
	a := ab.e
	ctx := ctxT(t, 60*time.Second)
	const slot = 256 << 10
	const workers = 6
	tmem := make([]byte, slot)
	fill(tmem, 7)
	tr, _ := b.Register("t", tmem)
	lmem := make([]byte, workers*slot)
	lr, _ := a.Register("l", lmem)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	fail := func(s string) { mu.Lock(); failures = append(failures, s); mu.Unlock() }
	sizes := []int{1, 100, 4 << 10, 4<<10 + 1, 16 << 10, 64 << 10, slot}
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := lmem[w*slot : (w+1)*slot]
			for i := range 150 {
				n := sizes[(i+w)%len(sizes)]
				scribble(mine[:n], 0xEE)
				f := ab.Read([]Op{{Local: lr, LocalOff: w * slot, Remote: tr.Remote(), Len: n}})
				cctx, cancel := context.WithCancel(ctx)
				if i%3 != 0 {
					go func() { time.Sleep(time.Duration(i%50) * time.Microsecond); cancel() }()
				}
				err := f.Wait(cctx)
				cancel()
				if err == nil {
					if !bytes.Equal(mine[:n], tmem[:n]) {
						fail("a read that succeeded has wrong bytes")
					}
					continue
				}
				if !errors.Is(err, ErrCancelled) {
					fail("read: " + err.Error())
					return
				}
				scribble(mine[:n], 0x33)
				time.Sleep(200 * time.Microsecond)
				if untouched(mine[:n], 0x33) >= 0 {
					fail("a cancelled read's slot written after its Wait")
				}
			}
		}()
	}
	// Sends and receives on the same link meanwhile.
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 8<<10)
		for i := range 200 {
			msg := bytes.Repeat([]byte{byte(i)}, 1+i*37%len(buf))
			fs := ba.Send(msg)
			fr := ab.Recv(buf)
			if err := fr.Wait(ctx); err != nil || fr.Len() != len(msg) || !bytes.Equal(buf[:fr.Len()], msg) {
				fail("recv wrong")
				return
			}
			if err := fs.Wait(ctx); err != nil {
				fail("send: " + err.Error())
				return
			}
		}
	}()
	wg.Wait()
	for i, s := range failures {
		if i < 5 {
			t.Error(s)
		}
	}
}

// TestMisuseTimeoutBound: with a context without deadline, Wait, Imm and
// Connect end at Options.Timeout with ErrTimeout naming the call and the
// peer.
func TestMisuseTimeoutBound(t *testing.T) {
	a, _, ab, _ := pair(t, func(o *Options) { o.Timeout = 300 * time.Millisecond })
	bg := context.Background()
	t0 := time.Now()
	misuseCheck(t, "recv never matched", ab.Recv(make([]byte, 4)).Wait(bg), ErrTimeout, `peer "b"`, "recv")
	misuseCheck(t, "send never matched", ab.Send(make([]byte, 4)).Wait(bg), ErrTimeout, `peer "b"`, "send")
	_, err := ab.Imm(bg)
	misuseCheck(t, "Peer.Imm", err, ErrTimeout, `peer "b"`, "imm")
	_, err = a.Imm(bg)
	misuseCheck(t, "Endpoint.Imm", err, ErrTimeout, "imm")
	_, err = a.Connect(bg, "nobody")
	misuseCheck(t, "Connect", err, ErrTimeout, `peer "nobody"`, "connect")
	if d := time.Since(t0); d > 4*time.Second {
		t.Errorf("five waits of 300 ms took %v", d)
	}
}

// TestMisuseWaitTwiceSmall: two Waits at once on a small transfer (whose
// Wait may read the socket itself), one of them cancelled: both return,
// with one outcome, and a cancelled one leaves the buffer alone.
func TestMisuseWaitTwiceSmall(t *testing.T) {
	_, b, ab, ba := pair(t, nil)
	a := ab.e
	ctx := ctxT(t, 60*time.Second)
	tmem := make([]byte, 4096)
	fill(tmem, 3)
	tr, _ := b.Register("t", tmem)
	lmem := make([]byte, 4096)
	lr, _ := a.Register("l", lmem)
	for i := range 300 {
		var f *Future
		var fs *Future
		buf := lmem
		if i%2 == 0 {
			f = ab.Read([]Op{{Local: lr, Remote: tr.Remote(), Len: 1 + i*13%4096}})
		} else {
			f = ab.Recv(buf)
			fs = ba.Send(tmem[:1+i*13%4096])
		}
		cctx, cancel := context.WithCancel(ctx)
		errs := make(chan error, 2)
		go func() { errs <- f.Wait(ctx) }()
		go func() { errs <- f.Wait(cctx) }()
		if i%4 < 2 {
			cancel()
		} else {
			go func() { time.Sleep(time.Duration(i%20) * time.Microsecond); cancel() }()
		}
		var got [2]error
		for k := range 2 {
			select {
			case got[k] = <-errs:
			case <-time.After(10 * time.Second):
				t.Fatalf("round %d: a Wait hangs", i)
			}
		}
		cancel()
		if (got[0] == nil) != (got[1] == nil) {
			t.Errorf("round %d: the Waits disagree: %v / %v", i, got[0], got[1])
		}
		if fs != nil {
			fs.Wait(ctx)
		}
		if got[0] != nil {
			scribble(lmem, 0x44)
			time.Sleep(100 * time.Microsecond)
			if j := untouched(lmem, 0x44); j >= 0 {
				t.Fatalf("round %d: byte %d written after a cancelled Wait", i, j)
			}
		}
	}
}

// TestMisuseRefusedBatchWritesNothing: a batch of MaxBatch operations
// whose last has a wrong key (or lies past its region) writes nothing
// anywhere and fails with ErrRefused, over every transport, also once
// the target's regions are leased (after a few good batches).
func TestMisuseRefusedBatchWritesNothing(t *testing.T) {
	transports(t, func(t *testing.T, tcpOnly bool, wantT string) {
		for _, shared := range []bool{false, true} {
			a, b, ab, _ := pair(t, func(o *Options) { o.TCPOnly = tcpOnly })
			ctx := ctxT(t, 60*time.Second)
			const page = 1024
			size := MaxBatch * page
			var t1 []byte
			var r1 *Region
			if shared {
				sh, err := NewShared(size)
				if err != nil {
					t.Fatal(err)
				}
				t1 = sh.Bytes()
				r1, _ = b.Register("t1", sh)
				defer func() { b.Deregister(ctx, r1); sh.Close() }()
			} else {
				t1 = make([]byte, size)
				r1, _ = b.Register("t1", t1)
			}
			t2 := make([]byte, size)
			r2, _ := b.Register("t2", t2)
			src := make([]byte, size)
			fill(src, 9)
			sr, _ := a.Register("src", src)
			build := func(bad int) []Op {
				ops := make([]Op, MaxBatch)
				for i := range ops {
					rr := r1.Remote()
					if i%2 == 1 {
						rr = r2.Remote()
					}
					ops[i] = Op{Local: sr, LocalOff: i * page, Remote: rr, RemoteOff: i * page, Len: page}
				}
				switch bad {
				case 1:
					ops[len(ops)-1].Remote.Key ^= 1
				case 2:
					ops[len(ops)-1].Remote.Size = uint64(size) + page
					ops[len(ops)-1].RemoteOff = size
				case 3:
					ops[len(ops)-1].Remote.ID += 1000
				}
				return ops
			}
			// Good batches first (leases, where the link takes them).
			for range 3 {
				if err := ab.Write(build(0)).Wait(ctx); err != nil {
					t.Fatal(err)
				}
				if err := ab.Read(build(0)).Wait(ctx); err != nil {
					t.Fatal(err)
				}
			}
			for bad := 1; bad <= 3; bad++ {
				clear(t1)
				clear(t2)
				for _, f := range []*Future{ab.Write(build(bad)), ab.WriteWithImm(build(bad), 5)} {
					err := f.Wait(ctx)
					misuseCheck(t, fmt.Sprintf("shared %v bad %d (%s)", shared, bad, f.Transport()), err, ErrRefused, `peer "b"`)
				}
				if !allZero(t1) || !allZero(t2) {
					t.Errorf("shared %v bad %d: a refused batch wrote bytes", shared, bad)
				}
				scribble(src, 0xCC)
				err := ab.Read(build(bad)).Wait(ctx)
				misuseCheck(t, fmt.Sprintf("read shared %v bad %d", shared, bad), err, ErrRefused, `peer "b"`)
				if i := untouched(src, 0xCC); i >= 0 {
					t.Errorf("shared %v bad %d: a refused read wrote byte %d", shared, bad, i)
					break
				}
				fill(src, 9)
			}
			cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			if im, err := a.Imm(cctx); err == nil {
				t.Errorf("an immediate of a refused batch: %+v", im)
			}
			if im, err := b.Imm(cctx); err == nil {
				t.Errorf("an immediate of a refused batch: %+v", im)
			}
			cancel()
		}
	})
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// TestMisuseDeregisterCancelledThenAgain: Deregister with a done context
// while a peer writes the region returns ErrCancelled (naming the peer
// and the region) or nil; a second Deregister then waits, and nothing
// writes the memory after it.
func TestMisuseDeregisterCancelledThenAgain(t *testing.T) {
	transports(t, func(t *testing.T, tcpOnly bool, wantT string) {
		a, b, ab, _ := pair(t, func(o *Options) { o.TCPOnly = tcpOnly })
		ctx := ctxT(t, 60*time.Second)
		const size = 8 << 20
		done, cancel := context.WithCancel(ctx)
		cancel()
		for round := range 4 {
			tmem := make([]byte, size)
			tr, _ := b.Register("t", tmem)
			src := make([]byte, size)
			sr, _ := a.Register("s", src)
			fill(src, 1)
			var fs []*Future
			for range 3 {
				fs = append(fs, ab.Write([]Op{{Local: sr, Remote: tr.Remote(), Len: size}}))
			}
			time.Sleep(time.Duration(round) * time.Millisecond)
			err := b.Deregister(done, tr)
			if err != nil && (!errors.Is(err, ErrCancelled) || !strings.Contains(err.Error(), `"t"`)) {
				t.Errorf("round %d: Deregister with a done context: %v", round, err)
			}
			t.Logf("round %d: %v", round, err)
			if err := b.Deregister(ctx, tr); err != nil {
				t.Fatalf("round %d: Deregister again: %v", round, err)
			}
			scribble(tmem, 0x12)
			for _, f := range fs {
				f.Wait(ctx)
			}
			time.Sleep(10 * time.Millisecond)
			if i := untouched(tmem, 0x12); i >= 0 {
				t.Fatalf("round %d: byte %d written after the second Deregister", round, i)
			}
			a.Deregister(ctx, sr)
		}
	})
}

// TestMisuseDeregisterSourceOfWrite: the source region of writes in
// flight deregistered: the writes fail with ErrClosed naming it, and the
// buffer overwritten at once afterwards draws no race report.
func TestMisuseDeregisterSourceOfWrite(t *testing.T) {
	transports(t, func(t *testing.T, tcpOnly bool, wantT string) {
		a, b, ab, _ := pair(t, func(o *Options) { o.TCPOnly = tcpOnly })
		ctx := ctxT(t, 60*time.Second)
		const size = 8 << 20
		tr, _ := b.Register("t", make([]byte, size))
		for round := range 4 {
			src := make([]byte, size)
			sr, _ := a.Register("src", src)
			var fs []*Future
			for range 3 {
				fs = append(fs, ab.Write([]Op{{Local: sr, Remote: tr.Remote(), Len: size}}))
			}
			time.Sleep(time.Duration(round) * time.Millisecond)
			if err := a.Deregister(ctx, sr); err != nil {
				t.Fatal(err)
			}
			for i := range src {
				src[i] = byte(i)
			}
			for _, f := range fs {
				if err := f.Wait(ctx); err != nil && (!errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), `"src"`)) {
					t.Errorf("round %d: %v", round, err)
				}
			}
		}
	})
}

// TestMisuseImmTakers: Endpoint.Imm and Peer.Imm waiting at once take
// each immediate once, between them, in the order they arrived.
func TestMisuseImmTakers(t *testing.T) {
	_, b, ab, ba := pair(t, nil)
	ctx := ctxT(t, 30*time.Second)
	lr, _ := ab.e.Register("l", make([]byte, 8))
	tr, _ := b.Register("t", make([]byte, 8*64))
	const n = 200
	got := make(chan uint32, 2*n)
	var wg sync.WaitGroup
	for k := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
				var im Imm
				var err error
				if k%2 == 0 {
					im, err = b.Imm(c)
				} else {
					im, err = ba.Imm(c)
				}
				cancel()
				if err != nil {
					return
				}
				got <- im.Value
			}
		}()
	}
	for i := range n {
		if err := ab.WriteWithImm([]Op{{Local: lr, Remote: tr.Remote(), RemoteOff: 8 * (i % 64), Len: 8}}, uint32(i)).Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	close(got)
	seen := map[uint32]bool{}
	for v := range got {
		if seen[v] {
			t.Errorf("immediate %d taken twice", v)
		}
		seen[v] = true
	}
	if len(seen) != n {
		t.Errorf("%d immediates taken, want %d", len(seen), n)
	}
}

// scribble sets every byte of b to v: memory a test then watches for a
// late write (untouched).
func scribble(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

// untouched is the index of the first byte of b that is not v, or -1.
func untouched(b []byte, v byte) int {
	for i, c := range b {
		if c != v {
			return i
		}
	}
	return -1
}
