package rendezvous

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"
)

// TestCloseUnderStorm: Close, while many clients set, add and block in
// Get, returns within 5 s and every goroutine the server started ends.
// Before the fix a request handled after Close closed s.changed a second
// time: a panic while holding the mutex (the process died), or Close hung
// in wg.Wait.
func TestCloseUnderStorm(t *testing.T) {
	for round := range 25 {
		before := runtime.NumGoroutine()
		s, err := Listen("127.0.0.1:0", ServerConfig{})
		if err != nil {
			t.Fatal(err)
		}
		const clients = 16
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cs := make([]*Client, clients)
		for i := range cs {
			if cs[i], err = Dial(ctx, s.Addr().String(), Auth{}); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		for i, c := range cs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := 0; ; j++ {
					var err error
					switch (i + j) % 3 {
					case 0:
						err = c.Set(ctx, fmt.Sprintf("k%d", j%7), []byte("v"))
					case 1:
						_, err = c.Add(ctx, "ctr", 1)
					case 2:
						_, err = c.Get(ctx, fmt.Sprintf("never%d", i))
					}
					if err != nil {
						return // the server went away: expected
					}
				}
			}()
		}
		time.Sleep(time.Duration(round%5) * time.Millisecond)
		closed := make(chan error, 1)
		go func() { closed <- s.Close() }()
		select {
		case <-closed:
		case <-time.After(5 * time.Second):
			buf := make([]byte, 1<<20)
			t.Fatalf("round %d: Close did not return within 5 s\n%s", round, buf[:runtime.Stack(buf, true)])
		}
		wg.Wait()
		for _, c := range cs {
			c.Close()
		}
		cancel()
		// Every goroutine of the server (and of the clients) ends.
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > before {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				t.Fatalf("round %d: %d goroutines before, %d after Close\n%s", round, before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// TestHungUpWaiterReleased: a client that hangs up (or cancels) while its
// Get waits frees its connection on the server at once, not when the wait
// times out: otherwise closed clients with long waits hold connections
// (and MaxConns) and goroutines for their whole timeout.
func TestHungUpWaiterReleased(t *testing.T) {
	// A short FrameTimeout: the watch must outlast the frame's deadline.
	const frameTimeout = 50 * time.Millisecond
	s, dial := startCfg(t, ServerConfig{FrameTimeout: frameTimeout})
	for _, how := range []string{"close", "cancel"} {
		c := dial()
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		done := make(chan error, 1)
		go func() { _, err := c.Get(ctx, "never"); done <- err }()
		// Wait until the server holds the request.
		waitFor(t, s, "one request waiting", func() bool { return s.waiting == 1 })
		time.Sleep(3 * frameTimeout) // the hang-up comes after the frame's deadline
		if how == "close" {
			// Close waits for the call's lock; drop the socket under it.
			c.conn.Close()
		} else {
			cancel()
		}
		<-done
		cancel()
		waitFor(t, s, "no connection held", func() bool { return len(s.conns) == 0 && s.waiting == 0 })
	}
}

// waitFor polls cond under s.mu, for at most 5 s.
func waitFor(t *testing.T, s *Server, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.mu.Lock()
		ok := cond()
		s.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not %s after 5 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
