package inter

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// TestStripeBoundaries: messages just past each striping boundary of four
// channels (1.5 MiB + 1 is the smallest that four connections carry and
// three cannot) cross intact both ways; a sender that striped over one
// connection fewer than the receiver expects is a mismatch here.
func TestStripeBoundaries(t *testing.T) {
	ts := pair(t, 0)
	for _, n := range []int{StripeMin + 1, 2 * StripeMin, 3*StripeMin + 1, 4*StripeMin + 5, 8<<20 + 3} {
		if k := Stripes(n, 4); k < 2 {
			t.Fatalf("%d bytes go over %d connections", n, k)
		}
		for it := range 2 {
			exchange(t, ts, n, it)
		}
	}
}

// TestMismatchAcrossStripes: two ranks that disagree about the size of a
// message, on either side of a striping boundary or of the direct path,
// both get ErrMismatch, and their streams stay in step: the next message,
// striped over all four connections, crosses intact. A sender that stripes
// over other connections than it names, or a receiver that drains one
// stripe too few, leaves a stale frame that the next message meets.
func TestMismatchAcrossStripes(t *testing.T) {
	ts := pair(t, 0)
	big := 4*StripeMin + 5 // four stripes
	cases := []struct{ a, b int }{
		{100, big},                       // direct receive of a striped message, and the reverse
		{StripeMin, StripeMin + 1},       // one stripe against two
		{3 * StripeMin, 3*StripeMin + 1}, // three against four
		{2*StripeMin + 1, 2 * StripeMin}, // three against two
		{DirectMax, 1},                   // both direct, one frame each
		{0, 3*StripeMin + 1},             // empty against four stripes
	}
	epoch := 0
	for _, c := range cases {
		t.Run(fmt.Sprintf("%d-vs-%d", c.a, c.b), func(t *testing.T) {
			epoch++
			errs := disagree(t, ts, [2]int{c.a, c.b}, uint64(100+epoch))
			for r, err := range errs {
				if !errors.Is(err, ErrMismatch) {
					t.Fatalf("rank %d (sends %d, expects %d): want ErrMismatch, got %v", r, []int{c.a, c.b}[r], []int{c.a, c.b}[r], err)
				}
			}
			// The streams are still in step on every connection.
			exchange(t, ts, big, 1000+epoch)
			exchange(t, ts, 100, 2000+epoch)
		})
	}
}

// disagree runs one exchange in which rank r sends n[r] bytes and expects
// n[r] bytes back, and returns each rank's first error; a rank whose
// transfer has not returned 30 s after its deadline fails the test (a
// hang, which -failfast then ends).
func disagree(t *testing.T, ts [2]*Transport, n [2]int, epoch uint64) [2]error {
	t.Helper()
	var errs [2]error
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			src, dst := make([]byte, n[r]), make([]byte, n[r])
			rng := rand.New(rand.NewPCG(epoch, uint64(r)))
			for i := range src {
				src[i] = byte(rng.Uint32())
			}
			tr, p, dl := ts[r], 1-r, time.Now().Add(10*time.Second)
			tr.Recv(p, epoch, 7, dst, dl)
			tr.Send(p, epoch, 7, src, dl)
			errs[r] = tr.WaitRecv(p)
			if err := tr.WaitSend(p); err != nil && errs[r] == nil {
				errs[r] = err
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(40 * time.Second):
		t.Fatalf("%d against %d bytes: a rank's transfer has not returned 30 s after its deadline", n[0], n[1])
	}
	return errs
}
