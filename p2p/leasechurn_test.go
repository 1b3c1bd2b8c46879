package p2p

import (
	"errors"
	"testing"
	"time"
)

// TestLeaseAfterChurn: a decode worker evicts cache blocks for good
// (Deregister, then Register of a new region: ids are never reused), and
// its prefill peer goes on writing into the new ones. Regions that are
// gone (their leases revoked, or refused as deregistered: a write that
// raced the eviction with the old RemoteRegion) must not use up the
// link's leases: after more evictions than maxLeases, a new region is
// still leased (its batches copied at once, no request), not sent the
// usual way for the link's life (a request and a grant per batch, about
// 4 times as slow for 64 KiB here).
func TestLeaseAfterChurn(t *testing.T) {
	a, b, ab, _ := pair(t, nil)
	ctx := ctxT(t, 60*time.Second)
	if ab.Transport() != "cma" {
		t.Skipf("transport %s: no leases", ab.Transport())
	}
	src := make([]byte, 64<<10)
	fill(src, 5)
	la, _ := a.Register("src", src)
	for i := range maxLeases + 100 {
		mem := make([]byte, 64<<10)
		r, err := b.Register("block", mem)
		if err != nil {
			t.Fatal(err)
		}
		rr := r.Remote()
		for range 2 { // the first asks the lease, the second goes through it
			if err := ab.Write([]Op{{Local: la, Remote: rr, Len: len(src)}}).Wait(ctx); err != nil {
				t.Fatalf("block %d: %v", i, err)
			}
		}
		if err := b.Deregister(ctx, r); err != nil {
			t.Fatal(err)
		}
		// A write that raced the eviction: refused, its lease too.
		if err := ab.Write([]Op{{Local: la, Remote: rr, Len: len(src)}}).Wait(ctx); !errors.Is(err, ErrRefused) {
			t.Fatalf("block %d: a write to it once deregistered: %v, want ErrRefused", i, err)
		}
	}
	mem := make([]byte, 64<<10)
	r, _ := b.Register("fresh", mem)
	if err := ab.Write([]Op{{Local: la, Remote: r.Remote(), Len: len(src)}}).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	leaseReady(t, ab, r.Remote())
	// Entries of gone regions are bounded too.
	ab.l.mu.Lock()
	n := len(ab.l.leases)
	ab.l.mu.Unlock()
	if n > 2*maxLeases+1 {
		t.Errorf("the link keeps %d lease entries after %d evictions, want at most %d", n, maxLeases+100, 2*maxLeases+1)
	}
}
