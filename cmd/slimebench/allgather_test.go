package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestNoLauncher: allgather without a launcher runs a world of one rank,
// and says so on stderr; under a launcher or with --in-process it says
// nothing of the kind.
func TestNoLauncher(t *testing.T) {
	bin := slimebench(t)
	sweep := []string{"allgather", "--backend", "cpu", "-b", "8", "-e", "8", "--iters", "1", "--warmup", "1", "--quiet"}
	for _, tc := range []struct {
		name string
		argv []string
		note bool
	}{
		{"alone", append([]string{bin}, sweep...), true},
		{"in-process", append(append([]string{bin}, sweep...), "--in-process", "2"), false},
		{"slimerun", append([]string{filepath.Join(filepath.Dir(bin), "slimerun"), "-q", "--standalone", "--nproc-per-node", "2", bin}, sweep...), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, code := run(t, tc.argv...)
			note := strings.Contains(out, "no launcher") && strings.Contains(out, "--in-process N")
			if code != 0 || note != tc.note || !strings.Contains(out, "Out of bounds values : 0 OK") || crashed(out) {
				t.Fatalf("exit %d, note %v, want exit 0, a table and note %v:\n%s", code, note, tc.note, out)
			}
		})
	}
}
