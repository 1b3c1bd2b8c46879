package p2p

import (
	"context"
	"testing"
	"time"
)

// TestCancelWakesParkedWait: a Wait parked on its connection's waker
// ends as soon as its context is cancelled, whenever the cancel comes: at
// once, while the Wait is about to park, or after it parked (a cancel
// whose wake-up the poller took before the park began was lost, and the
// Wait slept until Options.Timeout).
func TestCancelWakesParkedWait(t *testing.T) {
	ctx := ctxT(t, 60*time.Second)
	a := endpoint(t, ctx, Options{Name: "a", Auth: testAuth(), TCPOnly: true, Channels: 1, Timeout: 3 * time.Second})
	b := endpoint(t, ctx, Options{Name: "b", Auth: testAuth(), TCPOnly: true, Channels: 1})
	p, err := a.ConnectInfo(ctx, b.Info())
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	for i, end := 0, time.Now().Add(5*time.Second); time.Now().Before(end); i++ {
		c, cancel := context.WithCancel(context.Background()) // no deadline: Options.Timeout bounds the wait
		f := p.Recv(buf)                                      // nothing is sent: only the cancel ends it
		go func() {
			for j := 0; j < i%64; j++ { // cancels spread over the Wait's start
			}
			cancel()
		}()
		t0 := time.Now()
		err := f.Wait(c)
		if d := time.Since(t0); d > time.Second {
			t.Fatalf("iteration %d: Wait took %v after its context was cancelled: %v", i, d, err)
		}
		cancel()
	}
}
