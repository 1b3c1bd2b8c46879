package p2p

import (
	"bytes"
	"testing"
	"time"
)

// TestOpsReusedAfterCall: once Write returns, its []Op is the caller's
// again (building the next batch in it is ordinary Go), and the transfer
// goes where the ops said at the call, checked then. On a same-host link
// whose lease the copy goroutine uses, it read the ops later: a write then
// landed past the registered region, unchecked (plain memory), or crashed
// the process (Shared memory, an offset past the mapping).
func TestOpsReusedAfterCall(t *testing.T) {
	const region = 8 << 20 // over leaseInline: Shared memory too is copied in a goroutine
	for _, kind := range []string{"cma", "shm"} {
		t.Run(kind, func(t *testing.T) {
			a, b, ab, _ := pair(t, nil)
			ctx := ctxT(t, 30*time.Second)
			// Plain memory: the target's region is the first half of
			// its slice, the second half not registered. Shared memory:
			// the whole of it (an offset past it was a panic).
			big := make([]byte, 2*region)
			var mem any = big[:region]
			if kind == "shm" {
				sh, err := NewShared(region)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { sh.Close() })
				mem, big = sh, nil
			}
			tr, err := b.Register("t", mem)
			if err != nil {
				t.Fatal(err)
			}
			src := make([]byte, region)
			fill(src, 1)
			lr, _ := a.Register("l", src)
			for range 5 { // the lease comes up
				if err := ab.Write([]Op{{Local: lr, Remote: tr.Remote(), Len: 64 << 10}}).Wait(ctx); err != nil {
					t.Fatal(err)
				}
				time.Sleep(20 * time.Millisecond)
			}
			reg := tr.Bytes()
			for it := range 50 {
				clear(reg)
				ops := []Op{{Local: lr, Remote: tr.Remote(), Len: region}}
				f := ab.Write(ops)
				ops[0].RemoteOff, ops[0].Len = region-1, 2 // past the region, once the call has returned
				if err := f.Wait(ctx); err != nil {
					t.Fatalf("iteration %d: %v", it, err)
				}
				if f.Transport() != kind {
					t.Fatalf("transport %s, want %s", f.Transport(), kind)
				}
				if !bytes.Equal(reg, src) {
					t.Fatalf("iteration %d (%s): the write did not land where its ops said at the call", it, kind)
				}
				if big != nil && bytes.IndexFunc(big[region:], func(r rune) bool { return r != 0 }) >= 0 {
					t.Fatalf("iteration %d (%s): memory past the registered region was written", it, kind)
				}
			}
		})
	}
}
