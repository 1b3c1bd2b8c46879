package bench

import (
	"bytes"
	"strings"
	"testing"
)

// TestEmulatedTableSaysSo: a table holding any figure measured on the
// emulated CUDA library carries the EMULATED line under its title, and a
// GPU's or the CPU's table does not; CSV keeps the backend column.
func TestEmulatedTableSaysSo(t *testing.T) {
	row := func(backend string, inPlace bool) Result {
		return Result{Impl: "slimego", Backend: backend, Mode: "intra/graph", P: 2, Nodes: 1, S: 8, InPlace: inPlace}
	}
	for _, tc := range []struct {
		backends []string
		emulated bool
	}{
		{[]string{"cuda", "cuda"}, false},
		{[]string{"cpu", "cpu"}, false},
		{[]string{EmulatedBackend, EmulatedBackend}, true},
		{[]string{"cuda", EmulatedBackend}, true},
	} {
		rs := []Result{row(tc.backends[0], false), row(tc.backends[1], true)}
		var table, csv bytes.Buffer
		WriteTable(&table, rs, "title")
		if got := strings.Contains(table.String(), "\n# "+EmulatedNote+"\n"); got != tc.emulated {
			t.Errorf("%v: the table says emulated: %v, want %v\n%s", tc.backends, got, tc.emulated, table.String())
		}
		if err := WriteCSV(&csv, rs); err != nil {
			t.Fatal(err)
		}
		back, err := ReadCSV(&csv)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range back {
			if r.Backend != tc.backends[i] {
				t.Errorf("%v: row %d reads back as backend %q", tc.backends, i, r.Backend)
			}
		}
	}
}
