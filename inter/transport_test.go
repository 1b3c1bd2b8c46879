package inter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/auth"
	"github.com/slimego/slimego/internal/teststore"
	"github.com/slimego/slimego/rendezvous"
)

// testKey is the job's key the tests' transports hold.
var testKey = auth.NewKey([]byte("the job's secret"), "job-1")

// pair connects two transports, ranks 0 and 1, over loopback through a
// store of this process, with testKey; sockBuf sizes their send buffers.
func pair(t *testing.T, sockBuf int) [2]*Transport {
	t.Helper()
	return pairWith(t, Config{Channels: 4, SockBuf: sockBuf})
}

// pairWith is pair with cfg's knobs (Channels, Lowat, SockBuf,
// SendCopyMin); the store, store key, ranks, peers, address, timeout and
// job key are pair's. Each transport closes when the test ends.
func pairWith(t *testing.T, cfg Config) [2]*Transport {
	t.Helper()
	var ts [2]*Transport
	errs := teststore.Run(t, 2, 20*time.Second, func(ctx context.Context, st *rendezvous.Client, r int) error {
		c := cfg
		c.Store, c.Key, c.Rank, c.Peers = st, "t", r, []int{1 - r}
		c.MasterAddr, c.Timeout, c.Auth = "127.0.0.1", 10*time.Second, testKey
		var err error
		ts[r], err = New(ctx, c)
		return err
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		t.Cleanup(func() { ts[r].Close() })
	}
	return ts
}

// TestTransportPaths: messages of every size class cross right both ways
// at once, in the caller's goroutine up to a quarter of the send buffer
// (at most DirectMax) and through the connection goroutines beyond, on one
// connection or several. With 64 KiB send buffers (128 KiB as the kernel
// counts) 100 KB goes through the goroutines on one connection; with the
// default 4 MiB ones, where net.core.wmem_max allows them (it does on the
// development and CI machines), everything up to 512 KiB goes directly.
func TestTransportPaths(t *testing.T) {
	sizes := []int{3, 100_000, 300_001, DirectMax, 1<<20 + 3}
	for _, sockBuf := range []int{0, 64 << 10} {
		t.Run(fmt.Sprintf("sockbuf%d", sockBuf), func(t *testing.T) {
			ts := pair(t, sockBuf)
			sb := sendBuffer(ts[0].peers[1].conns[0].c)
			for _, n := range sizes {
				want := n <= min(DirectMax, sb/4)
				if got := ts[0].Direct(n); got != want {
					t.Fatalf("Direct(%d) = %v, want %v (send buffer %d)", n, got, want, sb)
				}
			}
			if sockBuf > 0 && ts[0].Direct(100_000) {
				t.Fatalf("100 KB goes directly with a send buffer of %d: the connection goroutines' single frame is not tested", sb)
			}
			for _, n := range sizes {
				for it := range 3 {
					exchange(t, ts, n, it)
				}
			}
		})
	}
}

// exchange sends n random bytes each way at once between the two
// transports of ts, as call it, and checks them byte for byte.
func exchange(t *testing.T, ts [2]*Transport, n, it int) {
	t.Helper()
	var bufs [2][2][]byte // [rank][send, recv]
	for r := range 2 {
		bufs[r][0], bufs[r][1] = make([]byte, n), make([]byte, n)
		rng := rand.New(rand.NewPCG(uint64(n), uint64(10*it+r)))
		for j := range bufs[r][0] {
			bufs[r][0][j] = byte(rng.Uint32())
		}
	}
	var wg sync.WaitGroup
	var errs [2]error
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr, p, dl := ts[r], 1-r, time.Now().Add(10*time.Second)
			tr.Recv(p, uint64(it), 7, bufs[r][1], dl)
			tr.Send(p, uint64(it), 7, bufs[r][0], dl)
			errs[r] = tr.WaitRecv(p)
			if err := tr.WaitSend(p); errs[r] == nil {
				errs[r] = err
			}
		}()
	}
	// A transfer that outlives its deadline hangs: fail (and, under
	// -failfast, end the run) instead of waiting for the binary's timeout.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(40 * time.Second):
		t.Fatalf("%d bytes, call %d: a rank's transfer has not returned 30 s after its deadline", n, it)
	}
	for r := range 2 {
		if errs[r] != nil {
			t.Fatalf("%d bytes, call %d, rank %d: %v", n, it, r, errs[r])
		}
		if got, want := bufs[r][1], bufs[1-r][0]; string(got) != string(want) {
			t.Fatalf("%d bytes, call %d: rank %d received other bytes than rank %d sent", n, it, r, 1-r)
		}
	}
}
