package rendezvous

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"
)

// TestNoLostWakeup: many clients wait for the keys of a round while many
// others set them, round after round; the last key's set is the round's
// last mutation, so a waiter that misses its wake-up (by taking the
// server's change channel after releasing the lock, when a set may already
// have replaced it) has nothing else to wake it and is still blocked
// seconds after every key exists. Each round must end within a bound far
// above its normal milliseconds. It fails without the race detector: with
// the channel taken just before the select, every run; with it taken on
// the instruction after the unlock, four runs in five (3 s of rounds).
func TestNoLostWakeup(t *testing.T) {
	const waiters, setters, bound = 16, 4, 5 * time.Second
	// More threads than cores: the kernel then preempts server goroutines
	// at any instruction, which widens a race window of a few instructions.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4 * runtime.NumCPU()))
	_, dial := start(t)
	ws, ss := make([]*Client, waiters), make([]*Client, setters)
	for i := range ws {
		ws[i] = dial()
	}
	for i := range ss {
		ss[i] = dial()
	}
	stop := time.Now().Add(3 * time.Second)
	rounds := 0
	for ; rounds < 10000 && time.Now().Before(stop); rounds++ {
		keys := make([]string, setters)
		for i := range keys {
			keys[i] = fmt.Sprintf("round%d/key%d", rounds, i)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var wg sync.WaitGroup
		done := make(chan error, waiters)
		for _, c := range ws {
			go func() { done <- c.Wait(ctx, keys...) }()
		}
		for i, c := range ss {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := c.Set(ctx, keys[i], []byte("v")); err != nil {
					t.Errorf("round %d: set %s: %v", rounds, keys[i], err)
				}
			}()
		}
		wg.Wait()
		set := time.Now()
		timer := time.NewTimer(bound)
		for n := range waiters {
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("round %d: wait: %v", rounds, err)
				}
			case <-timer.C:
				cancel()
				t.Fatalf("round %d: %d of %d waiters still blocked %v after every key was set: a lost wake-up", rounds, waiters-n, waiters, time.Since(set).Round(time.Millisecond))
			}
		}
		timer.Stop()
		cancel()
	}
	t.Logf("%d rounds", rounds)
}
