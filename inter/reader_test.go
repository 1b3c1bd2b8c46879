package inter

import (
	"bytes"
	"math/rand/v2"
	"net"
	"testing"
	"time"
)

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
		for rest := all; len(rest) > 0; {
			n := min(len(rest), 1+rng.IntN(300_000))
			c.Write(rest[:n])
			rest = rest[n:]
			if rng.IntN(4) == 0 {
				time.Sleep(time.Millisecond)
			}
		}
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
