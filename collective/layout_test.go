package collective

import (
	"github.com/slimego/slimego/internal/machine"
	"strings"
	"testing"
)

func TestParseWhere(t *testing.T) {
	id := "0b1f6f0c-2a7e-4c55-9d0e-3f1c2b4a5d6e"
	cases := []struct {
		in   string
		want where
		err  string
	}{
		{"0 1 2 " + id, where{0, 1, 2, id}, ""},
		{"3 0 1 -", where{3, 0, 1, "-"}, ""},
		{" 7  2 4\t" + id + "\n", where{7, 2, 4, id}, ""},
		{"0 1 2", where{}, "3 fields"},
		{"0 1 2 - x", where{}, "5 fields"},
		{"", where{}, "0 fields"},
		{"-1 0 1 -", where{}, "field 1"},
		{"0 x 1 -", where{}, "field 2"},
		{"0 0 2147483648 -", where{}, "field 3"},
		{"0 0 1 ../../etc", where{}, "machine"},
		{"0 0 1 ABC", where{}, "machine"},
		{"0 0 1 " + strings.Repeat("a", machine.MaxID+1), where{}, "machine"},
		{"0 0 1 " + strings.Repeat("a", machine.MaxID), where{0, 0, 1, strings.Repeat("a", machine.MaxID)}, ""},
	}
	for _, tc := range cases {
		got, err := parseWhere([]byte(tc.in))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("parseWhere(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("parseWhere(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
		if back, err := parseWhere([]byte(got.String())); err != nil || back != got {
			t.Errorf("%v does not round-trip: %v, %v", got, back, err)
		}
	}
}

// FuzzParseWhere: a layout entry read from the store is either refused or
// decoded into fields in range that encode back to an equal entry.
func FuzzParseWhere(f *testing.F) {
	f.Add([]byte("0 1 2 0b1f6f0c-2a7e-4c55-9d0e-3f1c2b4a5d6e"))
	f.Add([]byte("3 0 1 -"))
	f.Add([]byte("0 0 1 ../x"))
	f.Fuzz(func(t *testing.T, b []byte) {
		w, err := parseWhere(b)
		if err != nil {
			return
		}
		if w.node < 0 || w.local < 0 || w.size < 0 || !machine.ValidID(w.host) || len(w.host) > machine.MaxID {
			t.Fatalf("%q decoded to %+v", b, w)
		}
		if back, err := parseWhere([]byte(w.String())); err != nil || back != w {
			t.Fatalf("%+v does not round-trip: %+v, %v", w, back, err)
		}
	})
}

func TestSameHost(t *testing.T) {
	a, b := "aaaa", "bbbb"
	all := []where{{host: a}, {host: a}, {host: b}, {host: "-"}, {host: a}, {host: "-"}}
	for me, want := range []int{3, 3, 1, 0, 3, 0} {
		if got := sameHost(all, me); got != want {
			t.Errorf("rank %d: %d ranks on its machine, want %d", me, got, want)
		}
	}
}

func TestHostID(t *testing.T) {
	if id := machine.ID(); id == "-" || !machine.ValidID(id) {
		t.Errorf("machine.ID() = %q: this machine's boot id is not read", id)
	}
}
