package p2p

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestCloseStalledLeaseCopy: a copy through a lease of the peer's plain
// memory (process_vm, in a goroutine of its own) that the peer's pages
// hold up in the kernel holds Close as a grant's copy does: Close returns
// ErrTimeout saying the memory may still be written, within its bound,
// and not nil while the copy can still write this side's memory.
func TestCloseStalledLeaseCopy(t *testing.T) {
	u := newUffdTargetOpts(t, Options{Name: "a", Auth: testAuth(), Channels: 1, Heartbeat: time.Second})
	ctx, p, c, lr, rr, iov, pages := u.ctx, u.p, u.c, u.lr, u.rr, u.iov, u.pages
	f := p.Read([]Op{{Local: lr, Remote: rr, Len: 1 << 16}})
	h := sameHostRequest(t, c, iov) // the lease granted; the read itself refused
	c.Write(hdr(header{kind: kResp, sub: h.sub, id: h.id, status: stKey}))
	f.Wait(ctx)
	leaseReady(t, p, rr)
	f = p.Read([]Op{{Local: lr, Remote: rr, Len: 1 << 16}}) // through the lease: held up on the first page
	eventually(t, "the copy through the lease in the kernel", func() bool { return f.parts[0].copying.Load() > 0 })
	go func() { time.Sleep(15 * time.Second); pages() }()
	t0 := time.Now()
	err := u.a.Close()
	took := time.Since(t0)
	if bound := 3*u.a.opts.Heartbeat + 2*time.Second; took > bound {
		t.Fatalf("Close returned after %v (bound %v): %v", took.Round(time.Millisecond), bound, err)
	}
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "held up in the kernel") {
		select {
		case <-f.Done():
		default:
			t.Fatalf("Close: %v while the copy through the lease is held up (its Future not done), want ErrTimeout saying so", err)
		}
		t.Fatalf("Close: %v, want ErrTimeout saying a copy is held up", err)
	}
}
