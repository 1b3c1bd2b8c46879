package rendezvous

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// TestLargeBarrierDefaultLimits: a barrier of 1500 members on a store with
// the default limits (the one slimerun hosts), with keys as long as
// collective's "layout-read" barrier's. Every member that arrives early
// blocks in one Wait on all 1500 keys; the store holds only 1500 small
// keys, far below MaxTotalBytes, yet the waits' keys (1500 x 1500 x ~50
// bytes) are.
func TestLargeBarrierDefaultLimits(t *testing.T) {
	const P = 1500
	s, dial := startCfg(t, ServerConfig{})
	name := "slimego/run-0123456789abcdef/world/layout-read" // as collective's c.key("layout-read")
	clients := make([]*Client, P)
	for i := range clients {
		clients[i] = dial()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errs := make([]error, P)
	var wg sync.WaitGroup
	for i := range P - 1 {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = clients[i].Barrier(ctx, name, i, P) }()
	}
	// Until every early member has blocked (or, refused, has had 5 s to
	// be answered once all have arrived).
	start := time.Now()
	for time.Since(start) < 30*time.Second {
		s.mu.Lock()
		w := s.waiting
		s.mu.Unlock()
		n, _ := clients[P-1].NumKeys(ctx)
		if w == P-1 || n == P-1 && time.Since(start) > 5*time.Second {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	errs[P-1] = clients[P-1].Barrier(ctx, name, P-1, P)
	wg.Wait()
	bad, first := 0, error(nil)
	for _, err := range errs {
		if err != nil {
			if first == nil {
				first = err
			}
			if errors.Is(err, ErrBadRequest) {
				bad++
			}
		}
	}
	if first != nil {
		t.Fatalf("barrier of %d members on a default store: %d failed with ErrBadRequest; first error: %.300v", P, bad, first)
	}
}
