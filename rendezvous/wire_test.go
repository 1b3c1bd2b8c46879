package rendezvous

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
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
