package main

import (
	"encoding/csv"
	"strings"
	"testing"

	"github.com/slimego/slimego/internal/testbin"
)

// TestUncheckedRowsNoWrong: the rows of slimebench memcpy and tcp (and
// link's raw TCP row and the ceiling's, written alike) compare no byte:
// their CSV leaves the wrong column empty, as p2p's does, rather than 0,
// which reads as "checked, all right". (Rows that check, slimego's, say
// 0: collective's TestLinkAndTCPBenchmarks and bench's TestCeiling.)
func TestUncheckedRowsNoWrong(t *testing.T) {
	dir, err := testbin.Build()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		argv []string
	}{
		{"memcpy", []string{dir + "/slimebench", "memcpy", "-b", "1K", "-e", "4K", "--csv"}},
		{"tcp", []string{dir + "/slimerun", "-q", "--standalone", "--nproc-per-node", "2", dir + "/slimebench", "tcp", "-b", "1K", "-e", "4K", "--csv"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, code := run(t, tc.argv...)
			if code != 0 {
				t.Fatalf("exit %d:\n%s", code, out)
			}
			var text strings.Builder // rank 0's lines, without slimerun's prefix
			for line := range strings.Lines(out) {
				if rest, ok := strings.CutPrefix(line, "[0]: "); ok || !strings.HasPrefix(line, "[") {
					text.WriteString(rest)
				}
			}
			start := strings.Index(text.String(), "impl,")
			if start < 0 {
				t.Fatalf("no CSV:\n%s", out)
			}
			rows, err := csv.NewReader(strings.NewReader(text.String()[start:])).ReadAll()
			if err != nil {
				t.Fatalf("%v:\n%s", err, out)
			}
			if len(rows) < 2 {
				t.Fatalf("no rows:\n%s", out)
			}
			for _, r := range rows[1:] {
				if w := r[len(r)-1]; w != "" {
					t.Errorf("row %v: wrong %q, want empty (nothing checked)", r, w)
				}
			}
		})
	}
}
