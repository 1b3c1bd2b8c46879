package inter

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestHeaderLimits: counts and stripes at their limits decode; one over
// does not.
func TestHeaderLimits(t *testing.T) {
	for _, c := range []struct {
		h  Header
		ok bool
	}{
		{Header{Kind: KindData, Count: MaxCount, Total: MaxCount, Stripes: MaxStripes}, true},
		{Header{Kind: KindData, Count: 1, Total: MaxCount + 1, Stripes: 1}, false},
		{Header{Kind: KindData, Count: MaxCount + 1, Total: MaxCount + 1, Stripes: 1}, false},
		{Header{Kind: KindData, Count: 1, Total: 1, Stripes: MaxStripes + 1}, false},
		{Header{Kind: KindData, Count: 2, Total: 1, Stripes: 1}, false},
	} {
		var b [HeaderSize]byte
		c.h.Put(b[:])
		got, err := Decode(b[:])
		if (err == nil) != c.ok || c.ok && got != c.h {
			t.Errorf("%+v: got %+v, %v; want ok=%v", c.h, got, err, c.ok)
		}
	}
}

// tcpPair is a connected pair of loopback TCP connections.
func tcpPair(t *testing.T) (a, b *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dialed := make(chan net.Conn, 1)
	go func() {
		c, _ := net.Dial("tcp", ln.Addr().String())
		dialed <- c
	}()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	d := <-dialed
	if d == nil {
		t.Fatal("dial failed")
	}
	t.Cleanup(func() { c.Close(); d.Close() })
	return c.(*net.TCPConn), d.(*net.TCPConn)
}

func rcvlowat(t *testing.T, c *net.TCPConn) int {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	v := -1
	rc.Control(func(fd uintptr) { v, err = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVLOWAT) })
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestReaderSetsLowat: the socket's low-water mark is the smaller of what
// is asked and Lowat, at least 1; a Lowat of 0 or less leaves the kernel's
// mark alone; ReadFull sets the mark to what is left of a block from
// lowatMin up, and to 1 below.
func TestReaderSetsLowat(t *testing.T) {
	c, d := tcpPair(t)
	const L = 512 << 10
	r := NewReader(c, L)
	for _, s := range []struct{ ask, want int }{
		{100 << 10, 100 << 10}, {L + 1, L}, {0, 1}, {-5, 1}, {L, L}, {7, 7},
	} {
		r.SetLowat(s.ask)
		if got := rcvlowat(t, c); got != s.want {
			t.Errorf("SetLowat(%d) with Lowat %d: mark %d, want %d", s.ask, L, got, s.want)
		}
	}
	for _, lowat := range []int{0, -1} {
		off := NewReader(c, lowat)
		off.SetLowat(1000)
		if got := rcvlowat(t, c); got != 7 {
			t.Errorf("Lowat %d changed the mark to %d", lowat, got)
		}
	}
	// ReadFull of a block of exactly lowatMin, then of a small one. The
	// bytes are all in the receive queue first: otherwise a first read
	// may return part of the block (the kernel caps the mark while the
	// buffer is small) and the rest is read with the mark at 1.
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	go d.Write(make([]byte, lowatMin+10))
	queued(t, c, lowatMin+10)
	if err := r.ReadFull(make([]byte, lowatMin)); err != nil {
		t.Fatal(err)
	}
	if got := rcvlowat(t, c); got > lowatMin || got < 2 {
		t.Errorf("after a block of lowatMin bytes: mark %d, want up to %d set for it", got, lowatMin)
	}
	if err := r.ReadFull(make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	if got := rcvlowat(t, c); got != 1 {
		t.Errorf("after a small block: mark %d, want 1", got)
	}
	// A stream that ends inside a block.
	go func() { d.Write(make([]byte, 5)); d.CloseWrite() }()
	if err := r.ReadFull(make([]byte, 10)); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("a stream cut inside a block: %v, want io.ErrUnexpectedEOF", err)
	}
}

// queued waits, at most 10 s, until c's receive queue holds n bytes.
func queued(t *testing.T, c *net.TCPConn, n int) {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var have int
		rc.Control(func(fd uintptr) { have, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
		if have >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d bytes queued after 10 s", have, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestReadFullVecWays: ReadFullVec reads buffers that hold lowatMin bytes
// or more together (however small each is) with the low-water mark set for
// their total, and smaller batches buffer by buffer as ReadFull does, with
// the mark at 1, every buffer filled. A batch of pages read buffer by
// buffer would wake the reader once per segment; a small batch read with
// a mark for its total would wait for bytes that a peer's small frame
// never sends together.
func TestReadFullVecWays(t *testing.T) {
	c, d := tcpPair(t)
	r := NewReader(c, 1<<20) // a bound above the 2·(lowatMin+60) set below
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	data := make([]byte, lowatMin+60)
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	// Everything queued first, so that one readv takes the whole batch: a
	// first readv that returned part of it would leave the mark at what
	// was left. A mark above it makes the kernel (Linux 4.19 and later)
	// grow the receive buffer and window to hold it all (see Reader):
	// without it the queue stops near 128 KiB.
	r.SetLowat(2 * len(data))
	wrote := make(chan error, 1)
	go func() { _, err := d.Write(data); wrote <- err }()
	queued(t, c, len(data))
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	// The mark after each batch: set for the batch (from 2), or left at
	// 1 (0 on a socket whose mark was never set).
	for _, s := range []struct {
		name     string
		sizes    []int
		min, max int
	}{
		{"4 buffers of 64 KiB, lowatMin in all", []int{64 << 10, 64 << 10, 64 << 10, 64 << 10}, 2, lowatMin},
		{"3 small buffers and an empty one", []int{10, 0, 20, 30}, 0, 1},
	} {
		bufs := make([][]byte, len(s.sizes))
		outs := make([][]byte, len(s.sizes)) // bufs' slices, which ReadFullVec advances
		for i, n := range s.sizes {
			bufs[i] = make([]byte, n)
			outs[i] = bufs[i]
		}
		if err := r.ReadFullVec(bufs); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := rcvlowat(t, c); got < s.min || got > s.max {
			t.Errorf("%s: mark %d after the read, want %d to %d", s.name, got, s.min, s.max)
		}
		for i, b := range outs {
			if !bytes.Equal(b, data[:len(b)]) {
				t.Fatalf("%s: buffer %d of %d bytes: wrong bytes", s.name, i, len(b))
			}
			data = data[len(b):]
		}
	}
}
