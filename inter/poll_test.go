package inter

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"
)

// TestReaderPolled: a polling Reader reads blocks whole and in order
// however the sender cuts and spaces its writes (pieces of 1 byte to
// 4 KiB, pauses from none to longer than DefaultPollMax, so that reads are caught
// both while polling and after parking), at every polling budget the
// adaptation can reach.
func TestReaderPolled(t *testing.T) {
	for _, spin := range []time.Duration{0, time.Microsecond, DefaultPollMax} {
		a, b := tcpPair(t)
		rng := rand.New(rand.NewPCG(uint64(spin), 3))
		sizes := []int{48, 8, 48, 4096, 48, 1, 48, 200_000, 48, 65_536}
		var all []byte
		for _, n := range sizes {
			for range n {
				all = append(all, byte(rng.Uint32()))
			}
		}
		go func() {
			for rest := all; len(rest) > 0; {
				n := min(len(rest), 1+rng.IntN(4096))
				if _, err := a.Write(rest[:n]); err != nil {
					return
				}
				rest = rest[n:]
				switch rng.IntN(4) {
				case 0:
					time.Sleep(2 * DefaultPollMax)
				case 1:
					time.Sleep(10 * time.Microsecond)
				}
			}
		}()
		r := NewReader(b, DefaultLowat)
		r.bind()
		r.Poll = true
		r.SetDeadline(time.Now().Add(20 * time.Second))
		off := 0
		for _, n := range sizes {
			r.spin = spin
			got := make([]byte, n)
			if err := r.ReadFull(got); err != nil {
				t.Fatalf("budget %v, block of %d at %d: %v", spin, n, off, err)
			}
			if !bytes.Equal(got, all[off:off+n]) {
				t.Fatalf("budget %v, block of %d at %d: wrong bytes", spin, n, off)
			}
			off += n
		}
	}
}

// TestReaderPolledDeadline: a polled read with nothing to read ends at the
// connection's read deadline, whatever its budget, as a deadline error; a
// stream that ends inside a block is io.ErrUnexpectedEOF.
func TestReaderPolledDeadline(t *testing.T) {
	for _, spin := range []time.Duration{0, DefaultPollMax} {
		a, b := tcpPair(t)
		r := NewReader(b, DefaultLowat)
		r.bind()
		r.Poll, r.spin = true, spin
		r.SetDeadline(time.Now().Add(50 * time.Millisecond))
		err := r.ReadFull(make([]byte, 8))
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("budget %v: a read with nothing to read returned %v, want the deadline", spin, err)
		}
		r.SetDeadline(time.Now().Add(10 * time.Second))
		a.Write([]byte{1, 2, 3})
		a.Close()
		if err := r.ReadFull(make([]byte, 8)); err != io.ErrUnexpectedEOF {
			t.Fatalf("budget %v: a stream that ended inside the block returned %v, want io.ErrUnexpectedEOF", spin, err)
		}
	}
}

// TestReaderAdapt: a read that did not park restores the full budget; a
// budget that ran out halves, and grows by PollMax/64 when the wait still
// ended within PollMax, so that it settles near PollMax/32 where every
// budget runs out quickly, and falls to nothing where the waits are long.
func TestReaderAdapt(t *testing.T) {
	const M = DefaultPollMax
	r := Reader{PollMax: M, spin: M / 4}
	r.adapt(false, 7*time.Microsecond)
	if r.spin != M {
		t.Fatalf("after a read that did not park: budget %v, want PollMax", r.spin)
	}
	for range 20 {
		r.adapt(true, time.Second)
	}
	if r.spin != 0 {
		t.Fatalf("after long parked waits: budget %v, want 0", r.spin)
	}
	for range 40 {
		r.adapt(true, M/2)
	}
	if lo, hi := M/32-time.Microsecond, M/32+time.Microsecond; r.spin < lo || r.spin > hi {
		t.Fatalf("after short parked waits: budget %v, want about PollMax/32 (%v)", r.spin, M/32)
	}
	r.adapt(false, 0)
	if r.spin != M {
		t.Fatalf("bytes there at the first look after parked waits: budget %v, want PollMax", r.spin)
	}
	r = Reader{PollMax: 0}
	r.adapt(false, time.Microsecond)
	r.adapt(true, time.Microsecond)
	if r.spin != 0 {
		t.Fatalf("PollMax 0: budget %v", r.spin)
	}
}

// TestDirectNoAllocs: a direct exchange (the caller's goroutine, the
// polled receive) allocates nothing, on either side.
func TestDirectNoAllocs(t *testing.T) {
	ts := pair(t, 0)
	const n = 4096
	if !ts[0].Direct(n) {
		t.Fatalf("%d bytes do not go directly", n)
	}
	var bufs [2][2][]byte
	for r := range 2 {
		bufs[r][0], bufs[r][1] = make([]byte, n), make([]byte, n)
		for i := range bufs[r][0] {
			bufs[r][0][i] = byte(i*3 + r)
		}
	}
	const runs = 200
	call := func(r int, it uint64) error {
		tr, p, dl := ts[r], 1-r, time.Now().Add(10*time.Second)
		tr.Recv(p, it, 7, bufs[r][1], dl)
		tr.Send(p, it, 7, bufs[r][0], dl)
		err := tr.WaitRecv(p)
		if e := tr.WaitSend(p); err == nil {
			err = e
		}
		return err
	}
	var wg sync.WaitGroup
	var peerErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for it := range uint64(runs + 1) { // AllocsPerRun calls once more to warm up
			if err := call(1, it); err != nil {
				peerErr = err
				return
			}
		}
	}()
	var it uint64
	var err error
	allocs := testing.AllocsPerRun(runs, func() {
		if e := call(0, it); e != nil && err == nil {
			err = e
		}
		it++
	})
	wg.Wait()
	if err != nil || peerErr != nil {
		t.Fatalf("exchange: rank 0: %v, rank 1: %v", err, peerErr)
	}
	if allocs != 0 {
		t.Fatalf("a direct exchange allocated %v times per call", allocs)
	}
	if string(bufs[0][1]) != string(bufs[1][0]) || string(bufs[1][1]) != string(bufs[0][0]) {
		t.Fatal("the exchanged bytes differ from those sent")
	}
}

// TestReaderLeavesCallerDeadline: a Reader never given a deadline
// (SetDeadline) leaves the socket's read deadline to its caller, polling or
// not: a read with nothing to read ends at the deadline the caller set on
// the connection.
func TestReaderLeavesCallerDeadline(t *testing.T) {
	for _, poll := range []bool{false, true} {
		_, b := tcpPair(t)
		r := NewReader(b, DefaultLowat)
		r.bind()
		r.Poll = poll
		b.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if err := r.ReadFull(make([]byte, 8)); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("poll %v: a read with nothing to read returned %v, want the caller's deadline", poll, err)
		}
	}
}
