package main

import (
	"strings"
	"testing"
)

// TestOverlapPlotFails: a plot that cannot be written at the end of the
// sweep (its directory was writable, the name is a directory) fails the
// run, but only after the table is printed.
func TestOverlapPlotFails(t *testing.T) {
	bin := slimebench(t)
	plot := t.TempDir() // a directory: the PNG cannot be created in its place
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"table", nil, "t_overlap"},
		{"csv", []string{"--csv"}, "t_overlap_us"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			argv := append([]string{bin, "overlap", "--in-process", "2", "--backend", "cpu", "--m-min", "8", "--m-max", "8", "--nk", "8",
				"--iters", "1", "--cpu-window", "0", "--quiet", "--plot", plot}, tc.args...)
			out, code := run(t, argv...)
			if code != 1 || !strings.Contains(out, tc.want) || !strings.Contains(out, plot) || crashed(out) {
				t.Fatalf("exit %d, want exit 1 after the results (%q) and an error naming %s:\n%s", code, tc.want, plot, out)
			}
		})
	}
}
