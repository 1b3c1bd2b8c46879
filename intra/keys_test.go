package intra

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/internal/teststore"
	"github.com/slimego/slimego/rendezvous"
)

// TestAllocFreeKeepsStoreBounded: a long Alloc/Free loop does not fill the
// store. Each allocation's keys are deleted once every rank has mapped it,
// so the store's key count stays where Init left it, and a store whose
// limit is far below the number of allocations serves them all. (Before,
// every Alloc left two keys: past the limit rank 0's publish was refused
// and rank 1 waited out its timeout.)
func TestAllocFreeKeepsStoreBounded(t *testing.T) {
	const (
		L       = 2
		maxKeys = 1000
		iters   = 4000 // 8 times what maxKeys holds at 2 keys per Alloc
		every   = 100  // allocations between barriers
	)
	addr := teststore.Serve(t, rendezvous.ServerConfig{MaxKeys: maxKeys})
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	prefix := fmt.Sprintf("slimego-test-%d-keys-", os.Getpid())
	errs := teststore.Ranks(ctx, addr, L, func(ctx context.Context, st *rendezvous.Client, r int) error {
		g, err := New(ctx, Config{Store: st, Key: "t", ShmPrefix: prefix, Rank: r, Size: L, Timeout: 10 * time.Second})
		if err != nil {
			return err
		}
		defer g.Close()
		if err := g.Barrier(ctx); err != nil {
			return err
		}
		base, err := st.NumKeys(ctx)
		if err != nil {
			return err
		}
		most := base
		for i := range iters {
			b, err := g.Alloc(ctx, 64)
			if err != nil {
				return fmt.Errorf("alloc %d: %w", i, err)
			}
			b.Bytes()[0] = byte(i)
			if err := b.Free(); err != nil {
				return fmt.Errorf("free %d: %w", i, err)
			}
			// Rank 0 need not wait for the others in Alloc, so
			// it may run ahead: a barrier now and then bounds
			// the allocations in flight.
			if i%every == every-1 {
				n, err := st.NumKeys(ctx)
				if err != nil {
					return err
				}
				most = max(most, n)
				if err := g.Barrier(ctx); err != nil {
					return fmt.Errorf("barrier after alloc %d: %w", i, err)
				}
			}
		}
		// In flight at any moment: the two keys of each
		// allocation that a rank has not mapped yet, at most
		// every between barriers.
		n, err := st.NumKeys(ctx)
		if err != nil {
			return err
		}
		most = max(most, n)
		if most > base+2*every {
			return fmt.Errorf("the store grew from %d keys to %d over %d allocations", base, most, iters)
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	if left, _ := os.ReadDir("/dev/shm"); left != nil {
		for _, e := range left {
			if strings.HasPrefix(e.Name(), prefix) {
				t.Errorf("/dev/shm/%s left behind", e.Name())
			}
		}
	}
}

// TestAllocFullStoreFailsAtOnce: when the store refuses rank 0's publish
// (it is full), rank 0 aborts the name's waits, and the other rank fails
// at once with ErrPeerLost naming rank 0, not after its timeout.
func TestAllocFullStoreFailsAtOnce(t *testing.T) {
	const L = 2
	addr := teststore.Serve(t, rendezvous.ServerConfig{MaxKeys: 200})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	prefix := fmt.Sprintf("slimego-test-%d-full-", os.Getpid())
	errs := make([]error, L)
	var joined, filled sync.WaitGroup
	joined.Add(L)
	filled.Add(1)
	var wg sync.WaitGroup
	for r := range L {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = func() error {
				st, err := rendezvous.Dial(ctx, addr, rendezvous.Auth{})
				if err != nil {
					joined.Done()
					return err
				}
				defer st.Close()
				g, err := New(ctx, Config{Store: st, Key: "t", ShmPrefix: prefix, Rank: r, Size: L, Timeout: 30 * time.Second})
				joined.Done()
				if err != nil {
					return err
				}
				defer g.Close()
				filled.Wait()
				start := time.Now()
				_, err = g.Alloc(context.Background(), 64)
				if d := time.Since(start); d > 10*time.Second {
					return fmt.Errorf("Alloc failed after %v: %v", d, err)
				}
				var oe *fault.OpError
				switch {
				case err == nil:
					return errors.New("Alloc succeeded in a full store")
				case !errors.As(err, &oe) || oe.Op != "alloc" || oe.Rank != r:
					return fmt.Errorf("want an alloc error of rank %d, got %v", r, err)
				case r == 1 && !(errors.Is(err, fault.ErrPeerLost) && oe.Peer == 0) && !strings.Contains(err.Error(), "its limit"):
					return fmt.Errorf("want ErrPeerLost naming rank 0, or the store's refusal, got %v", err)
				}
				t.Logf("rank %d: %v", r, err)
				return nil
			}()
		}()
	}
	joined.Wait()
	foe, err := rendezvous.Dial(ctx, addr, rendezvous.Auth{})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; foe.Set(ctx, fmt.Sprintf("fill/%d", i), nil) == nil; i++ {
		if i > 1000 {
			t.Fatal("the store takes more keys than its limit")
		}
	}
	foe.Close()
	filled.Done()
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}
