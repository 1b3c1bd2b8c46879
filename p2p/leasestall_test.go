package p2p

import (
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
	leased(t, u)
	f := u.p.Read([]Op{{Local: u.lr, Remote: u.rr, Len: 1 << 16}}) // through the lease: held up on the first page
	eventually(t, "the copy through the lease in the kernel", func() bool { return f.parts[0].copying.Load() > 0 })
	go func() { time.Sleep(15 * time.Second); u.pages() }()
	closeHeldUp(t, u.a)
}
