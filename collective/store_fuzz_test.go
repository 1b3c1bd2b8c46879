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
// operation, one size per rank and, for a refused call, a bounded reason,
// and encodes back to the same.
func FuzzDecodeCall(f *testing.F) {
	f.Add([]byte("allgatherv 5 4 3"))
	f.Add([]byte("barrier 0 0 0"))
	f.Add([]byte("allgather 1 2"))
	f.Add([]byte("x -1 99999999999999999999 3"))
	f.Add([]byte("!allgather 0 0 0 destination+holds+8+bytes"))
	f.Add([]byte("!allgatherv 0 0 0 %ZZ"))
	f.Fuzz(func(t *testing.T, b []byte) {
		const n = 3
		cl, err := decodeCall(b, n)
		if err != nil {
			return
		}
		if len(cl.sizes) != n || cl.name == "" || len(cl.refused) > maxReason {
			t.Fatalf("%q decoded to %+v", b, cl)
		}
		back, err := decodeCall(encodeCall(cl, n), n)
		if err != nil || !sameCall(back, cl) {
			t.Fatalf("%+v does not round-trip: %+v, %v", cl, back, err)
		}
	})
}

// TestCheckKnobsResolved: ranks whose settings resolve alike agree (auto
// against the algorithm auto picks; an explicit backend against auto
// where auto picks it), and ranks whose resolved values differ do not.
func TestCheckKnobsResolved(t *testing.T) {
	one := layout{members: [][]int{{0, 1}}, uniform: true}
	two := layout{members: [][]int{{0, 1}, {2, 3}}, uniform: true}
	uneven := layout{members: [][]int{{0, 1}, {2}}}
	k := func(algo, backend string) knobs {
		return knobs{knobWorldSize: "4", knobAlgo: algo, knobBackend: backend, knobChannels: "4", knobSlotBytes: "262144", knobSlots: "4", knobGPUScratch: "0"}
	}
	for _, tc := range []struct {
		name string
		lay  layout
		a, b knobs
		want string // "" where they agree
	}{
		{"one node, hier and auto", one, k("hier", "cpu"), k("auto", "cpu"), ""},
		{"two nodes, hier and auto", two, k("hier", "cpu"), k("auto", "cpu"), ""},
		{"uneven, ring and auto", uneven, k("ring", "cpu"), k("auto", "cpu"), ""},
		{"two nodes, ring and auto", two, k("ring", "cpu"), k("auto", "cpu"), "SLIME_ALGO differs: rank 0 has ring, rank 1 has hier (auto)"},
		{"cuda and cuda/auto", one, k("auto", "cuda"), k("auto", "cuda/auto"), ""},
		{"cpu and cuda", one, k("auto", "cpu"), k("auto", "cuda"), "SLIME_BACKEND differs"},
	} {
		all := []knobs{tc.a, tc.b, tc.b, tc.b}
		if len(tc.lay.members) == 1 {
			all = all[:2]
			for i := range all {
				all[i][knobWorldSize] = "2"
			}
		}
		if tc.lay.members[len(tc.lay.members)-1][0] == 2 && len(tc.lay.members[len(tc.lay.members)-1]) == 1 {
			all = all[:3]
			for i := range all {
				all[i][knobWorldSize] = "3"
			}
		}
		err := checkKnobs(0, tc.lay, all)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

// TestLongReason: a refused call's reason longer than maxReason, cut in
// the middle of a character, is published cut at that character's start
// and reads back the same on every rank.
func TestLongReason(t *testing.T) {
	long := strings.Repeat("a", maxReason-1) + "×" + strings.Repeat("b", 40)
	cl := call{name: "allgather", refused: long}
	got, err := decodeCall(encodeCall(cl, 3), 3)
	if err != nil {
		t.Fatalf("a long reason does not read back: %v", err)
	}
	if want := cutReason(long); got.refused != want || len(want) > maxReason || want != strings.Repeat("a", maxReason-1) {
		t.Fatalf("read back %d bytes %q, want %d bytes", len(got.refused), got.refused, len(want))
	}
}
