package rendezvous

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"reflect"
	"testing"
	"testing/iotest"
)

func TestWireRoundTrip(t *testing.T) {
	cases := []message{
		{Code: uint8(opSet), Keys: []string{"a"}, Value: []byte("hello")},
		{Code: uint8(opGet), Keys: []string{"k/with/slashes"}, TimeoutMS: 1500},
		{Code: uint8(opAdd), Keys: []string{"ctr"}, N: -7},
		{Code: uint8(opCompareAndSet), Keys: []string{"x"}, Value: []byte{}, Value2: []byte{0, 1, 2}},
		{Code: uint8(opWait), Keys: []string{"a", "b", "", "d"}, TimeoutMS: 1},
		{Code: statusOK, N: 1 << 40, Value: bytes.Repeat([]byte{0xAB}, 1000)},
		{Code: statusTimeout},
		{Code: uint8(opAbort), Keys: []string{"slimego/run/"}, N: 3, Value: []byte("rank 3 exited")},
		{Code: statusAborted, Keys: []string{"slimego/run/"}, N: 3, Value: []byte("rank 3 exited")},
	}
	for _, m := range cases {
		frame := m.encode(nil)
		got, err := readFrame(bytes.NewReader(frame), new([]byte), frameLimit(DefaultMaxValueBytes))
		if err != nil {
			t.Fatalf("%+v: %v", m, err)
		}
		norm := func(b []byte) []byte {
			if len(b) == 0 {
				return nil
			}
			return b
		}
		got.Value, got.Value2 = norm(got.Value), norm(got.Value2)
		m.Value, m.Value2 = norm(m.Value), norm(m.Value2)
		if !reflect.DeepEqual(got, m) {
			t.Errorf("round trip: got %+v, want %+v", got, m)
		}
	}
}

func TestWireRejects(t *testing.T) {
	good := (&message{Code: 1, Keys: []string{"key"}, Value: []byte("v")}).encode(nil)[lengthPrefix:]
	cases := map[string][]byte{
		"empty":          {},
		"short header":   good[:fixedHeader-1],
		"bad version":    append([]byte{9}, good[1:]...),
		"truncated key":  good[:fixedHeader+5],
		"trailing bytes": append(append([]byte{}, good...), 0),
		"too many keys":  append([]byte{wireVersion, 1, 0xff, 0xff}, make([]byte, 12+8)...),
	}
	for name, body := range cases {
		if _, err := decode(body); !errors.Is(err, errMalformed) {
			t.Errorf("%s: err = %v, want errMalformed", name, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add((&message{Code: 1, Keys: []string{"key"}, Value: []byte("v")}).encode(nil)[lengthPrefix:])
	f.Add((&message{Code: 5, Keys: []string{"a", "b"}, TimeoutMS: 10}).encode(nil)[lengthPrefix:])
	f.Add([]byte{wireVersion, 0, 0, 0})
	f.Fuzz(func(t *testing.T, body []byte) {
		m, err := decode(body)
		if err != nil {
			return
		}
		// Whatever decodes must encode back to the same bytes.
		again := m.encode(nil)[lengthPrefix:]
		if !bytes.Equal(again, body) {
			t.Fatalf("decode/encode not inverse:\n in %x\nout %x", body, again)
		}
	})
}

// TestFrameLimitExact: the largest frame a value limit allows (a key list
// of maxKeyListBytes, prefixes included, and two values of the limit, as a
// CompareAndSet) is exactly frameLimit long and is read; one byte more is
// refused before its body is read; a frame that ends after its length
// prefix, or inside its body, is io.ErrUnexpectedEOF.
func TestFrameLimitExact(t *testing.T) {
	const maxValue = 10
	keys := make([]string, maxKeyListBytes/MaxKeyBytes)
	for i := range keys {
		keys[i] = string(bytes.Repeat([]byte{'k'}, MaxKeyBytes-4))
	}
	m := message{Code: uint8(opCompareAndSet), Keys: keys, Value: bytes.Repeat([]byte{1}, maxValue), Value2: bytes.Repeat([]byte{2}, maxValue)}
	frame := m.encode(nil)
	limit := frameLimit(maxValue)
	if body := len(frame) - lengthPrefix; body != int(limit) {
		t.Fatalf("the largest frame's body is %d bytes, frameLimit(%d) = %d", body, maxValue, limit)
	}
	got, err := readFrame(bytes.NewReader(frame), new([]byte), limit)
	if err != nil || len(got.Keys) != len(keys) || !bytes.Equal(got.Value2, m.Value2) {
		t.Fatalf("the largest frame: %v", err)
	}
	var tooLarge *frameTooLargeError
	if _, err := readFrame(bytes.NewReader(frame), new([]byte), limit-1); !errors.As(err, &tooLarge) || tooLarge.N != limit {
		t.Fatalf("a frame one byte over the limit: %v", err)
	}
	for _, n := range []int{lengthPrefix, len(frame) - 1} {
		if _, err := readFrame(bytes.NewReader(frame[:n]), new([]byte), limit); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("a frame cut after %d bytes: %v, want io.ErrUnexpectedEOF", n, err)
		}
	}
}

// TestMaxValueBytesLimit: a server takes MaxValueBytes up to the limit a
// client accepts, and refuses one byte more.
func TestMaxValueBytesLimit(t *testing.T) {
	s, err := Listen("127.0.0.1:0", ServerConfig{MaxValueBytes: maxValueLimit})
	if err != nil {
		t.Fatalf("MaxValueBytes at the limit: %v", err)
	}
	s.Close()
	if s, err := Listen("127.0.0.1:0", ServerConfig{MaxValueBytes: maxValueLimit + 1}); err == nil {
		s.Close()
		t.Fatal("MaxValueBytes over the limit accepted")
	}
}

// TestAnnouncedFrameNotAllocated: a frame's length prefix alone, of the
// limit, makes readFrame hold no more than the bytes that came, not the
// announced size: a member that opens many connections and announces
// the largest frame on each cannot make the store hold that much memory
// for each without sending it.
func TestAnnouncedFrameNotAllocated(t *testing.T) {
	const limit = 6 << 20
	var in bytes.Buffer
	binary.Write(&in, binary.LittleEndian, uint32(limit))
	in.Write(make([]byte, 1000)) // then the connection ends
	var buf []byte
	if _, err := readFrame(&in, &buf, limit); err != io.ErrUnexpectedEOF {
		t.Fatalf("a frame cut short: %v, want io.ErrUnexpectedEOF", err)
	}
	if cap(buf) > growStep {
		t.Fatalf("a frame of %d bytes announced and 1000 sent: %d bytes allocated", limit, cap(buf))
	}
	// A whole frame still reads, across many small reads.
	m := message{Code: uint8(opSet), Keys: []string{"k"}, Value: bytes.Repeat([]byte{7}, 300_000)}
	whole := m.encode(nil)
	var got []byte
	back, err := readFrame(iotest.OneByteReader(bytes.NewReader(whole)), &got, limit)
	if err != nil || !bytes.Equal(back.Value, m.Value) || back.Keys[0] != "k" {
		t.Fatalf("a whole frame read in one-byte reads: %v", err)
	}
}
