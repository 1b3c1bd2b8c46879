package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCompareRows: compare fails when no row of one file matches a row of
// another, and refuses a row whose time is not a measured one, naming
// the file and the line; rows that match are compared.
func TestCompareRows(t *testing.T) {
	bin := slimebench(t)
	dir := t.TempDir()
	const header = "impl,backend,mode,P,nodes,S,median_us,algbw_GBps,busbw_GBps,wrong\n"
	file := func(name, rows string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(header+rows), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	base := file("base.csv", "slimego,cpu,intra,2,1,8,2.0,0.008,0.004,0\nslimego/in-place,cpu,intra,2,1,8,1.0,0.016,0.008,0\n")
	for _, tc := range []struct {
		name, other string
		code        int
		want        string
	}{
		{"match", "mpi,cpu,intra,2,1,8,4.0,0.004,0.002,0\n", 0, "2.00x"},
		{"no match", "mpi,cpu,intra,4,1,8,4.0,0.004,0.002,0\nmpi,cpu,intra,2,1,64,4.0,0.004,0.002,0\n", 1, "no rows matched"},
		{"NaN", "mpi,cpu,intra,2,1,8,4.0,0.004,0.002,0\nmpi/in-place,cpu,intra,2,1,8,NaN,0.004,0.002,0\n", 1, "line 3: median_us NaN"},
		{"zero", "mpi,cpu,intra,2,1,8,0,0.004,0.002,0\n", 1, "line 2: median_us 0"},
		{"Inf", "mpi,cpu,intra,2,1,8,+Inf,0.004,0.002,0\n", 1, "line 2: median_us +Inf"},
		{"negative busbw", "mpi,cpu,intra,2,1,8,4,0.004,-1,0\n", 1, "line 2: busbw_GBps -1"},
		{"wrong bytes", "mpi,cpu,intra,2,1,8,4.0,0.004,0.002,3\n", 1, "line 2: 3 wrong bytes"},
		{"size 0", "mpi,cpu,intra,2,1,0,0,0,0,0\nmpi,cpu,intra,2,1,8,4.0,0.004,0.002,0\n", 0, "2.00x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			other := file(strings.ReplaceAll(tc.name, " ", "-")+".csv", tc.other)
			out, code := run(t, bin, "compare", base, other)
			if tc.code != 0 && !strings.Contains(out, other) && tc.name != "no match" {
				t.Errorf("the error does not name %s", other)
			}
			if code != tc.code || !strings.Contains(out, tc.want) || strings.Contains(out, "NaNx") || strings.Contains(out, "Infx") || crashed(out) {
				t.Fatalf("exit %d, want %d saying %q:\n%s", code, tc.code, tc.want, out)
			}
		})
	}
}

// TestCompareLauncherOutput: the CSV of 'slimerun ... slimebench allgather
// --csv > a.csv' carries slimerun's rank prefix on every line ("[0]: "),
// and compare reads it as it is (it refused the file: "header is not
// impl,..."), rows of the prefix's rank alone.
func TestCompareLauncherOutput(t *testing.T) {
	bin := slimebench(t)
	dir := t.TempDir()
	const header = "impl,backend,mode,P,nodes,S,median_us,algbw_GBps,busbw_GBps,wrong\n"
	base := filepath.Join(dir, "base.csv")
	if err := os.WriteFile(base, []byte(header+"slimego,cpu,intra,2,1,8,2.0,0.008,0.004,0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, other string
		code        int
		want        string
	}{
		{"rank 0's lines", "[0]: " + header + "[0]: mpi,cpu,intra,2,1,8,4.0,0.004,0.002,0\n", 0, "2.00x"},
		{"a rank above 9", "[12]: " + header + "[12]: mpi,cpu,intra,2,1,8,4.0,0.004,0.002,0\n", 0, "2.00x"},
		{"another rank's line", "[0]: " + header + "[1]: mpi,cpu,intra,2,1,8,4.0,0.004,0.002,0\n", 1, `line 2 does not start with "[0]: " as the header does`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			other := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".csv")
			if err := os.WriteFile(other, []byte(tc.other), 0o644); err != nil {
				t.Fatal(err)
			}
			out, code := run(t, bin, "compare", base, other)
			if code != tc.code || !strings.Contains(out, tc.want) || crashed(out) {
				t.Fatalf("exit %d, want %d saying %q:\n%s", code, tc.code, tc.want, out)
			}
		})
	}
}
