package inter

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
	"time"
)

// TestReadAhead: frames of a header and a payload, read with ReadAhead
// expecting a payload that is sometimes the frame's, sometimes shorter or
// longer than it (a mismatch: the read may then take the next frame's
// bytes), then the payload read whole or discarded; every byte arrives
// once, in order, polled or not, however the sender cuts its writes.
func TestReadAhead(t *testing.T) {
	for _, poll := range []bool{false, true} {
		a, b := tcpPair(t)
		rng := rand.New(rand.NewPCG(7, uint64(len(t.Name()))))
		type frame struct {
			hdr, body []byte
			expect    int
			discard   bool
		}
		var frames []frame
		var all []byte
		for range 300 {
			f := frame{hdr: make([]byte, HeaderSize), body: make([]byte, rng.IntN(AheadMax+200))}
			for i := range f.hdr {
				f.hdr[i] = byte(rng.Uint32())
			}
			for i := range f.body {
				f.body[i] = byte(rng.Uint32())
			}
			switch rng.IntN(4) {
			case 0:
				f.expect = rng.IntN(2 * AheadMax) // a mismatch, or above AheadMax
			case 1:
				f.expect, f.discard = rng.IntN(AheadMax), true
			default:
				f.expect = len(f.body)
			}
			frames = append(frames, f)
			all = append(append(all, f.hdr...), f.body...)
		}
		go func() {
			for rest := all; len(rest) > 0; {
				n := min(len(rest), 1+rng.IntN(3*AheadMax))
				if _, err := a.Write(rest[:n]); err != nil {
					return
				}
				rest = rest[n:]
				if rng.IntN(8) == 0 {
					time.Sleep(50 * time.Microsecond)
				}
			}
			a.Close()
		}()
		r := NewReader(b, DefaultLowat)
		r.bind()
		r.Poll = poll
		r.SetDeadline(time.Now().Add(20 * time.Second))
		hdr := make([]byte, HeaderSize)
		for i, f := range frames {
			if err := r.ReadAhead(hdr, f.expect); err != nil {
				t.Fatalf("poll %v, frame %d: header: %v", poll, i, err)
			}
			if !bytes.Equal(hdr, f.hdr) {
				t.Fatalf("poll %v, frame %d: wrong header", poll, i)
			}
			if f.discard {
				if err := r.Discard(uint64(len(f.body))); err != nil {
					t.Fatalf("poll %v, frame %d: discard: %v", poll, i, err)
				}
				continue
			}
			got := make([]byte, len(f.body))
			if err := r.ReadFull(got); err != nil {
				t.Fatalf("poll %v, frame %d: payload of %d: %v", poll, i, len(got), err)
			}
			if !bytes.Equal(got, f.body) {
				t.Fatalf("poll %v, frame %d: payload of %d (expected %d): wrong bytes", poll, i, len(got), f.expect)
			}
		}
		if err := r.ReadFull(make([]byte, 1)); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("poll %v: after the last frame: %v, want the stream's end", poll, err)
		}
	}
}

// TestReadAheadHeaderAlone: ReadAhead may take up to more bytes past the
// header, and never waits for any of them: a header that arrives alone
// (a frame without payload, read with room for one, as p2p reads every
// header) is returned at once, polled or not.
func TestReadAheadHeaderAlone(t *testing.T) {
	for _, poll := range []bool{false, true} {
		a, b := tcpPair(t)
		r := NewReader(b, DefaultLowat)
		if poll {
			r.bind()
			r.Poll = true
		}
		// A read that waited for more would end at this deadline, and
		// then (the header being whole) return it without an error.
		const deadline = 5 * time.Second
		r.SetDeadline(time.Now().Add(deadline))
		want := bytes.Repeat([]byte{7}, HeaderSize)
		a.Write(want)
		got := make([]byte, HeaderSize)
		start := time.Now()
		err := r.ReadAhead(got, AheadMax)
		if d := time.Since(start); err != nil || d >= deadline {
			t.Fatalf("poll %v: a header alone, nothing after it: %v after %v (the deadline: %v)", poll, err, d, deadline)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("poll %v: the header differs", poll)
		}
	}
}

// TestReadAheadCutShort: a stream that ends inside the header, with or
// without some of it sent, is io.ErrUnexpectedEOF from ReadAhead (room
// for more past the header or not), never a header returned part-filled.
func TestReadAheadCutShort(t *testing.T) {
	for _, sent := range []int{0, 5} {
		for _, more := range []int{0, AheadMax} {
			a, b := tcpPair(t)
			r := NewReader(b, DefaultLowat)
			r.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := a.Write(bytes.Repeat([]byte{9}, sent)); err != nil {
				t.Fatal(err)
			}
			if err := a.CloseWrite(); err != nil {
				t.Fatal(err)
			}
			if err := r.ReadAhead(make([]byte, HeaderSize), more); err != io.ErrUnexpectedEOF {
				t.Errorf("%d bytes of a %d-byte header, then the end, room for %d more: %v, want io.ErrUnexpectedEOF", sent, HeaderSize, more, err)
			}
		}
	}
}
