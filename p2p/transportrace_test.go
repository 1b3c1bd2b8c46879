package p2p

import (
	"testing"
	"time"
)

// TestMisuseTransportWhileRunning: Future.Transport read while the
// transfer runs (a caller logging it), where the same-host grant is
// refused (the target's region is GPU memory) and the part goes over TCP
// after all: the race detector sees no race.
func TestMisuseTransportWhileRunning(t *testing.T) {
	g := gpuOrSkip(t)
	_, b, ab, _ := pair(t, nil)
	a := ab.e
	ctx := ctxT(t, 60*time.Second)
	const size = 1 << 20
	d := gpuAllocFor(t, g, size)
	tr, err := b.Register("gpu", d)
	if err != nil {
		t.Fatal(err)
	}
	lr, _ := a.Register("l", make([]byte, size))
	for range 20 {
		f := ab.Read([]Op{{Local: lr, Remote: tr.Remote(), Len: size}})
		stop := make(chan struct{})
		done := make(chan string)
		go func() {
			s := ""
			for {
				select {
				case <-stop:
					done <- s
					return
				default:
					s = f.Transport()
				}
			}
		}()
		if err := f.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		close(stop)
		<-done
		if f.Transport() != "tcp" {
			t.Logf("transport %q", f.Transport())
		}
	}
}
