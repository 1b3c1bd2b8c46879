package inter

import (
	"bytes"
	"errors"
	"testing"
)

func TestHeaderRoundTrip(t *testing.T) {
	for _, h := range []Header{
		{Kind: KindData, Sender: 7, Epoch: 1, Hash: 0xdeadbeef, Count: 16 << 20, Total: 64 << 20, Stripes: 4},
		{Kind: KindHello, Sender: 1<<32 - 1, Epoch: 3},
		{Kind: KindData, Stripes: 1},
	} {
		var b [HeaderSize]byte
		h.Put(b[:])
		got, err := Decode(b[:])
		if err != nil || got != h {
			t.Errorf("round trip %+v: got %+v, %v", h, got, err)
		}
	}
}

func TestHeaderRejects(t *testing.T) {
	var good [HeaderSize]byte
	(&Header{Kind: KindData, Count: 1, Total: 2, Stripes: 2}).Put(good[:])
	var hello [HeaderSize]byte
	(&Header{Kind: KindHello, Epoch: 1}).Put(hello[:])
	mod := func(b []byte, i int, v byte) []byte { b = bytes.Clone(b); b[i] = v; return b }
	for name, b := range map[string][]byte{
		"short":              good[:HeaderSize-1],
		"magic":              mod(good[:], 0, 0),
		"version":            mod(good[:], 2, 1),
		"kind":               mod(good[:], 3, 0),
		"huge size":          mod(good[:], 31, 0xff),
		"huge total":         mod(good[:], 39, 0xff),
		"count above total":  mod(good[:], 24, 3),
		"no stripes":         mod(good[:], 40, 0),
		"too many stripes":   mod(good[:], 41, 2),
		"reserved":           mod(good[:], 47, 1),
		"hello with stripes": mod(hello[:], 40, 1),
		"hello with a count": mod(hello[:], 24, 1),
	} {
		if _, err := Decode(b); !errors.Is(err, ErrFrame) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	var b [HeaderSize]byte
	(&Header{Kind: KindData, Sender: 3, Epoch: 9, Hash: 1, Count: 100, Total: 300, Stripes: 3}).Put(b[:])
	f.Add(b[:])
	(&Header{Kind: KindHello, Sender: 1, Epoch: 1}).Put(b[:])
	f.Add(b[:])
	f.Add([]byte{0x47, 0x53, 1, 2})
	f.Fuzz(func(t *testing.T, in []byte) {
		h, err := Decode(in)
		if err != nil {
			return
		}
		var out [HeaderSize]byte
		h.Put(out[:])
		if !bytes.Equal(out[:], in[:HeaderSize]) {
			t.Fatalf("decode/encode differ: %x vs %x", in[:HeaderSize], out)
		}
	})
}
