package inter

import (
	"bytes"
	"errors"
	"testing"
)

func TestHeaderRoundTrip(t *testing.T) {
	for _, h := range []Header{
		{Kind: KindData, Sender: 7, Epoch: 1, Hash: 0xdeadbeef, Count: 64 << 20},
		{Kind: KindHello, Sender: 1<<32 - 1, Epoch: 3},
		{Kind: KindData},
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
	(&Header{Kind: KindData, Count: 1}).Put(good[:])
	mod := func(i int, v byte) []byte { b := bytes.Clone(good[:]); b[i] = v; return b }
	for name, b := range map[string][]byte{
		"short":     good[:HeaderSize-1],
		"magic":     mod(0, 0),
		"version":   mod(2, 9),
		"kind":      mod(3, 0),
		"huge size": mod(31, 0xff),
	} {
		if _, err := Decode(b); !errors.Is(err, ErrFrame) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	var b [HeaderSize]byte
	(&Header{Kind: KindData, Sender: 3, Epoch: 9, Hash: 1, Count: 100}).Put(b[:])
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
