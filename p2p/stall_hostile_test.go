package p2p

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSecondGrantKeepsCopying: a peer answers one same-host read
// twice. The first answer (B) grants the 64 KiB in MaxBatch ranges, each
// naming a "Shared memory" whose file is not one, so that B spends a while
// trying to map them before its first process_vm copy; the second (A)
// grants it whole, and A's copy is held up in the kernel on the first
// page (holding the part's lock). Wait's deadline marks the part ending
// while B is still mapping; B's vmCopy then sets copying, finds the part
// ending, and clears copying on its way out, although A is still in the
// kernel holding the lock. The next finish (Deregister's) sees no copy
// and waits for the lock itself, without Deregister's bound.
func TestSecondGrantKeepsCopying(t *testing.T) {
	u := newUffdTarget(t)
	f := u.p.Read([]Op{{Local: u.lr, Remote: u.rr, Len: 1 << 16}})
	h := sameHostRequest(t, u.c, nil)
	if h.kind != kReq || h.sub != rReadV {
		t.Fatalf("got %+v, want a same-host read", h)
	}
	tf, err := os.Create(filepath.Join(t.TempDir(), "notshm"))
	if err != nil {
		t.Fatal(err)
	}
	defer tf.Close()
	src := binary.LittleEndian.Uint64(u.iov)
	const k = MaxBatch
	per := uint64(1<<16) / k
	iovB := make([]byte, k*IovSize)
	for i := range k {
		v := iovB[i*IovSize:]
		binary.LittleEndian.PutUint64(v, src+uint64(i)*per)
		binary.LittleEndian.PutUint64(v[8:], per)
		binary.LittleEndian.PutUint64(v[16:], 1) // a Shared memory...
		binary.LittleEndian.PutUint64(v[24:], uint64(i)*per)
		binary.LittleEndian.PutUint32(v[32:], uint32(tf.Fd())) // ...whose file is not one
	}
	u.c.Write(append(hdr(header{kind: kResp, sub: rReadV, id: h.id, b: k, payload: k * IovSize}), iovB...))
	u.c.Write(append(hdr(header{kind: kResp, sub: rReadV, id: h.id, b: 1, payload: IovSize}), u.iov...))
	time.Sleep(10 * time.Millisecond) // A is in the kernel; B still maps
	wctx, cancel := context.WithTimeout(u.ctx, 10*time.Millisecond)
	defer cancel()
	if err := f.Wait(wctx); !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "held up in the kernel") {
		t.Fatalf("Wait: %v, want ErrTimeout saying the copy is held up", err)
	}
	time.Sleep(2 * time.Second) // B has found the part ending
	go func() { time.Sleep(6 * time.Second); u.pages() }()
	p := f.parts[0]
	if p.copying.Load() == 0 {
		t.Errorf("part.copying is false while a copy of the part is still in the kernel (it holds the part's lock)")
	}
	dctx, dcancel := context.WithTimeout(u.ctx, 300*time.Millisecond)
	defer dcancel()
	t0 := time.Now()
	err = u.a.Deregister(dctx, u.lr)
	if took := time.Since(t0); took > 2*time.Second {
		t.Fatalf("Deregister with a 300 ms deadline returned after %v (%v)", took.Round(time.Millisecond), err)
	}
}

// TestCloseAfterDeregisterStalled: Deregister of the local region of
// a held-up same-host copy returns its ErrTimeout (the region's memory must
// not be reused). Close then no longer sees the region (it was withdrawn),
// so the held-up part is in none of its lists: its wait for the links'
// goroutines times out (the copy goroutine is still in the kernel), and it
// returns nil, although a goroutine of the endpoint is still in a copy that
// writes into this side's memory.
func TestCloseAfterDeregisterStalled(t *testing.T) {
	u := newUffdTargetOpts(t, Options{Name: "a", Auth: testAuth(), Channels: 1, Heartbeat: time.Second})
	f := stalledRead(t, u, 10*time.Second)
	dctx, cancel := context.WithTimeout(u.ctx, 300*time.Millisecond)
	defer cancel()
	if err := u.a.Deregister(dctx, u.lr); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Deregister: %v, want ErrTimeout (the copy is held up)", err)
	}
	err := u.a.Close()
	select {
	case <-f.Done():
		t.Fatal("the read is done: the copy was not held up")
	default:
	}
	if err == nil {
		t.Fatalf("Close returned nil while a same-host copy of the endpoint is still in the kernel, writing into this side's memory (its Future is not done)")
	}
}
