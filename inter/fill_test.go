package inter

import (
	"bytes"
	"errors"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestFillPeek: Fill adds what the socket holds to the buffered bytes, up
// to its bound, which the next reads return first, in order; it says
// EAGAIN when nothing is there, (0, nil) when the bound is reached, and
// (0, nil) at the stream's end. A Direct read of what is not buffered
// waits for it in ppoll, by the deadline.
func TestFillPeek(t *testing.T) {
	a, b := tcpPair(t)
	r := NewReader(b, 0)
	fd := uintptr(r.FD())
	if n, err := r.Fill(fd, 16); n != 0 || err != unix.EAGAIN {
		t.Fatalf("Fill of an empty socket: %d, %v, want 0, EAGAIN", n, err)
	}
	msg := []byte("0123456789abcdefghij")
	a.Write(msg[:6])
	waitFill := func(upto, want int) {
		t.Helper()
		for dl := time.Now().Add(5 * time.Second); r.Buffered() < want; {
			if _, err := r.Fill(fd, upto); err != nil && err != unix.EAGAIN {
				t.Fatal(err)
			}
			if time.Now().After(dl) {
				t.Fatalf("buffered %d, want %d", r.Buffered(), want)
			}
		}
	}
	waitFill(16, 6)
	if !bytes.Equal(r.Peek(), msg[:6]) {
		t.Fatalf("Peek %q, want %q", r.Peek(), msg[:6])
	}
	var head [4]byte
	if err := r.ReadFull(head[:]); err != nil || string(head[:]) != "0123" {
		t.Fatalf("ReadFull %q, %v", head, err)
	}
	a.Write(msg[6:])
	waitFill(16, 16) // moves "45" to the front, then reads up to 16 in all
	if n, err := r.Fill(fd, 16); n != 0 || err != nil {
		t.Fatalf("Fill at its bound: %d, %v, want 0, nil", n, err)
	}
	if !bytes.Equal(r.Peek(), msg[4:20]) {
		t.Fatalf("Peek %q, want %q", r.Peek(), msg[4:20])
	}
	// A Direct read takes the buffered bytes, then waits for the rest.
	r.Direct = true
	r.SetDeadline(time.Now().Add(5 * time.Second))
	rest := make([]byte, 20)
	go func() { time.Sleep(20 * time.Millisecond); a.Write([]byte("KLMN")) }()
	if err := r.ReadFull(rest); err != nil || string(rest) != "456789abcdefghijKLMN" {
		t.Fatalf("Direct ReadFull %q, %v", rest, err)
	}
	// And ends by its deadline.
	r.SetDeadline(time.Now().Add(50 * time.Millisecond))
	if err := r.ReadFull(rest[:1]); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a Direct read of a silent socket: %v, want os.ErrDeadlineExceeded", err)
	}
	r.Direct = false
	a.Close()
	for dl := time.Now().Add(5 * time.Second); ; {
		n, err := r.Fill(fd, 16)
		if n == 0 && err == nil {
			break // the stream's end
		}
		if time.Now().After(dl) {
			t.Fatalf("Fill after the peer's close: %d, %v", n, err)
		}
	}
}
