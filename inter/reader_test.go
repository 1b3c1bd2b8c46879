package inter

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"
)

// writeCut writes all to c in writes of 1 to most bytes, now and then
// pausing a millisecond, as a sender that the reader cannot predict.
func writeCut(c net.Conn, all []byte, most int, rng *rand.Rand) {
	for rest := all; len(rest) > 0; {
		n := min(len(rest), 1+rng.IntN(most))
		c.Write(rest[:n])
		rest = rest[n:]
		if rng.IntN(4) == 0 {
			time.Sleep(time.Millisecond)
		}
	}
}

// Blocks of any size, the tails shorter than the low-water mark included,
// arrive whole and in order, however the sender cuts its writes: a mark
// above what is left would make the read wait forever.
func TestReaderLowat(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	sizes := []int{32, 1, 5<<20 + 3, 32, 7, 4 << 20, 32, 100_000, 1<<20 - 1}
	var all []byte
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range sizes {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		all = append(all, b...)
	}
	go func() {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return
		}
		defer c.Close()
		writeCut(c, all, 300_000, rng)
		time.Sleep(time.Second) // the reader must not need the close
	}()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tc := c.(*net.TCPConn)
	tc.SetReadBuffer(DefaultSockBuf)
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	for _, lowat := range []int{DefaultLowat} {
		r := NewReader(tc, lowat)
		off := 0
		for _, n := range sizes {
			got := make([]byte, n)
			if err := r.ReadFull(got); err != nil {
				t.Fatalf("lowat %d, block of %d at %d: %v", lowat, n, off, err)
			}
			if !bytes.Equal(got, all[off:off+n]) {
				t.Fatalf("lowat %d, block of %d at %d: wrong bytes", lowat, n, off)
			}
			off += n
		}
	}
}

// TestReadFullVec: a block read into many buffers at once (more than one
// readv takes, of sizes down to one byte and none, after a ReadAhead
// whose buffered bytes come first) arrives whole and in order, however
// the sender cuts its writes; a stream that ends early is
// io.ErrUnexpectedEOF.
func TestReadFullVec(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	rng := rand.New(rand.NewPCG(3, 4))
	// Each block: a list of buffer sizes.
	blocks := [][]int{
		{64 << 10, 64 << 10, 64 << 10, 64 << 10, 64 << 10}, // a batch of pages
		{1, 0, 300_000, 7},
		{100}, // small: ReadFull's way
		nil,   // 3000 buffers of 100 bytes: more than one readv takes
		{5 << 20, 1, 3 << 20},
	}
	for range 3000 {
		blocks[3] = append(blocks[3], 100)
	}
	const head = 32
	var all []byte
	var want int
	for _, bl := range blocks {
		for _, n := range bl {
			want += n
		}
	}
	all = make([]byte, head+want)
	for i := range all {
		all[i] = byte(rng.Uint32())
	}
	go func() {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return
		}
		defer c.Close()
		c.Write(all[:head+100]) // the header and the first block's start: ReadAhead takes both
		writeCut(c, all[head+100:], 200_000, rng)
		c.Write([]byte{1, 2, 3}) // then the stream ends early
	}()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tc := c.(*net.TCPConn)
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	r := NewReader(tc, DefaultLowat)
	hdr := make([]byte, head)
	if err := r.ReadAhead(hdr, AheadMax); err != nil { // takes some of the first block too
		t.Fatal(err)
	}
	if !bytes.Equal(hdr, all[:head]) {
		t.Fatal("the header read ahead differs")
	}
	if r.ahi == r.alo {
		t.Fatal("ReadAhead buffered none of the first block: the first ReadFullVec would take none")
	}
	off := head
	var bufs [][]byte
	for i, bl := range blocks {
		bufs = bufs[:0]
		var outs [][]byte
		for _, n := range bl {
			b := make([]byte, n)
			outs = append(outs, b)
			bufs = append(bufs, b)
		}
		if err := r.ReadFullVec(bufs); err != nil {
			t.Fatalf("block %d at %d: %v", i, off, err)
		}
		for j, b := range outs {
			if !bytes.Equal(b, all[off:off+len(b)]) {
				t.Fatalf("block %d, buffer %d of %d bytes at %d: wrong bytes", i, j, len(b), off)
			}
			off += len(b)
		}
	}
	end := [][]byte{make([]byte, 200_000), make([]byte, 200_000)}
	if err := r.ReadFullVec(end); err != io.ErrUnexpectedEOF {
		t.Fatalf("a stream that ends 3 bytes into a read of 400000: %v, want io.ErrUnexpectedEOF", err)
	}
}
