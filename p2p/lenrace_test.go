package p2p

import (
	"testing"
	"time"
)

// TestMisuseLenWhileRunning: Future.Len read while the receive runs (a
// caller polling it, before Wait) is no data race: it reads 0 or the
// length, and the length once Wait returned nil.
func TestMisuseLenWhileRunning(t *testing.T) {
	_, _, ab, ba := pair(t, nil)
	ctx := ctxT(t, 30*time.Second)
	buf := make([]byte, 64)
	for i := range 50 {
		fr := ab.Recv(buf)
		stop := make(chan struct{})
		done := make(chan int)
		go func() {
			n := 0
			for {
				select {
				case <-stop:
					done <- n
					return
				default:
					n = fr.Len()
				}
			}
		}()
		time.Sleep(100 * time.Microsecond)
		fs := ba.Send(make([]byte, 1+i))
		if err := fr.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		close(stop)
		if n := <-done; n != 0 && n != 1+i {
			t.Errorf("Len read %d while running", n)
		}
		if fr.Len() != 1+i {
			t.Errorf("Len %d, want %d", fr.Len(), 1+i)
		}
		fs.Wait(ctx)
	}
}
