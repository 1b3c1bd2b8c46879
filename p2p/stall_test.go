package p2p

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// stalledRead starts u's read of the peer's 64 KiB region, whose pages a
// userfaultfd holds back, and grants it: it returns once the copy is
// blocked in the kernel on the first page. The pages come after release.
func stalledRead(t *testing.T, u uffdTarget, release time.Duration) *Future {
	t.Helper()
	f := u.p.Read([]Op{{Local: u.lr, Remote: u.rr, Len: 1 << 16}})
	h := sameHostRequest(t, u.c, nil)
	if h.kind != kReq || h.sub != rReadV {
		t.Fatalf("got %+v, want a same-host read", h)
	}
	u.c.Write(append(hdr(header{kind: kResp, sub: rReadV, id: h.id, b: 1, payload: IovSize}), u.iov...))
	time.Sleep(100 * time.Millisecond) // the copy is blocked on the first page
	go func() { time.Sleep(release); u.pages() }()
	return f
}

// TestCancelStalledCopy: a same-host copy held up in process_vm_readv by
// the peer's memory (pages a userfaultfd holds back; as well a file on a
// hung file system) holds its part's lock and cannot be stopped. Wait's
// deadline still ends the Wait, within stallGrace, with ErrTimeout saying
// the memory may still be written, and the Future is done only once the
// copy has returned; a second Wait then returns the same timeout.
func TestCancelStalledCopy(t *testing.T) {
	u := newUffdTarget(t)
	f := stalledRead(t, u, 3*time.Second)
	wctx, cancel := context.WithTimeout(u.ctx, 300*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	err := f.Wait(wctx)
	if took := time.Since(t0); took > 2*time.Second {
		t.Fatalf("Wait with a 300 ms deadline returned after %v (%v): it waited for the held-up copy's pages", took.Round(time.Millisecond), err)
	}
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "held up in the kernel") {
		t.Fatalf("Wait: %v, want ErrTimeout saying the copy is held up", err)
	}
	select {
	case <-f.Done():
		t.Fatal("the Future is done while its copy is still in the kernel")
	default:
	}
	select {
	case <-f.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the Future is not done 10 s after the pages were let through")
	}
	if err := f.Wait(u.ctx); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Wait after the copy returned: %v, want the ErrTimeout of the first", err)
	}
}

// TestDeregisterStalledCopy: Deregister of the local region of a held-up
// same-host copy (as in TestCancelStalledCopy) ends at its context's
// deadline, with ErrTimeout naming the transfer, instead of waiting for
// the peer's pages; once they came, Deregister succeeds.
func TestDeregisterStalledCopy(t *testing.T) {
	u := newUffdTarget(t)
	f := stalledRead(t, u, 3*time.Second)
	dctx, cancel := context.WithTimeout(u.ctx, 300*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	err := u.a.Deregister(dctx, u.lr)
	if took := time.Since(t0); took > 2*time.Second {
		t.Fatalf("Deregister with a 300 ms deadline returned after %v (%v)", took.Round(time.Millisecond), err)
	}
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "held up in the kernel") {
		t.Fatalf("Deregister: %v, want ErrTimeout saying a copy is held up", err)
	}
	if err := f.Wait(u.ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("the read: %v, want ErrClosed (its region deregistered)", err)
	}
	if err := u.a.Deregister(u.ctx, u.lr); err != nil {
		t.Fatalf("Deregister once the copy returned: %v", err)
	}
}

// TestCloseStalledCopy: Close with a held-up same-host copy in flight
// returns within its bound (three heartbeats), with
// ErrTimeout naming the transfer, rather than when the pages come.
func TestCloseStalledCopy(t *testing.T) {
	u := newUffdTargetOpts(t, Options{Name: "a", Auth: testAuth(), Channels: 1, Heartbeat: time.Second})
	stalledRead(t, u, 15*time.Second)
	closeHeldUp(t, u.a)
}

// closeHeldUp closes a, which has a same-host copy held up in the
// kernel: Close must return within its bound (three heartbeats), with
// ErrTimeout saying a copy is held up.
func closeHeldUp(t *testing.T, a *Endpoint) {
	t.Helper()
	t0 := time.Now()
	err := a.Close()
	took := time.Since(t0)
	if bound := 3*a.opts.Heartbeat + 2*time.Second; took > bound {
		t.Fatalf("Close returned after %v (bound %v): %v", took.Round(time.Millisecond), bound, err)
	}
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "held up in the kernel") {
		t.Fatalf("Close: %v, want ErrTimeout saying a copy is held up", err)
	}
}
