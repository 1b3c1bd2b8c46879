package collective

import (
	"strings"
	"testing"
	"unicode"
)

// FuzzParseKnobs: a knobs entry read from the store decodes to fields
// without spaces, of at most 64 bytes, that encode back to the same.
func FuzzParseKnobs(f *testing.F) {
	f.Add([]byte("4 hier cpu 4 1048576 8 0"))
	f.Add([]byte("4 hier cpu 4 1048576 8"))
	f.Add([]byte(" a  b c d e f g "))
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := parseKnobs(b)
		if err != nil {
			return
		}
		for i, s := range k {
			if s == "" || len(s) > 64 || strings.ContainsFunc(s, unicode.IsSpace) {
				t.Fatalf("%q: field %d decoded to %q", b, i, s)
			}
		}
		if back, err := parseKnobs([]byte(k.String())); err != nil || back != k {
			t.Fatalf("%v does not round-trip: %v, %v", k, back, err)
		}
	})
}

// FuzzDecodeCall: a rank's call read from the store decodes to the
// operation and one size per rank, and encodes back to the same.
func FuzzDecodeCall(f *testing.F) {
	f.Add([]byte("allgatherv 5 4 3"))
	f.Add([]byte("barrier 0 0 0"))
	f.Add([]byte("allgather 1 2"))
	f.Add([]byte("x -1 99999999999999999999 3"))
	f.Fuzz(func(t *testing.T, b []byte) {
		const n = 3
		cl, err := decodeCall(b, n)
		if err != nil {
			return
		}
		if len(cl.sizes) != n || cl.name == "" {
			t.Fatalf("%q decoded to %+v", b, cl)
		}
		back, err := decodeCall(encodeCall(cl, n), n)
		if err != nil || !sameCall(back, cl) {
			t.Fatalf("%+v does not round-trip: %+v, %v", cl, back, err)
		}
	})
}
