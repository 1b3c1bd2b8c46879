package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/testbin"
)

// TestRunsTooLarge: counts beyond the time rule's cap (bench.MaxIters)
// and overlap shapes whose matrices exceed the memory available are
// refused before anything runs, exit 2 with a line naming the flag, by
// every rank of a launched job: they tried multi-GB allocations and died
// of the runtime's "out of memory", or ran for hours. The commands run
// with their virtual memory capped (16 GB), so that one that does try
// the allocation fails at once instead of taking the machine's memory.
func TestRunsTooLarge(t *testing.T) {
	bin := slimebench(t)
	slimerun := filepath.Join(filepath.Dir(bin), "slimerun")
	const huge = "2000000000"
	small := []string{"--m-min", "4", "--m-max", "4", "--nk", "4", "--cpu-window", "0", "--quiet"}
	for _, tc := range []struct {
		launched bool // two ranks under slimerun, else no launcher
		args     []string
		want     string
	}{
		{false, []string{"allgather", "-b", "8", "-e", "8", "--iters", huge}, "allgather: --iters " + huge + ": want 1 to 200000"},
		{false, []string{"allgather", "-b", "8", "-e", "8", "--warmup", huge}, "allgather: --warmup " + huge + ": want 1 to 200000"},
		{true, []string{"allgather", "--quiet", "-b", "8", "-e", "8", "--iters", huge}, "allgather: --iters " + huge + ": want 1 to 200000"},
		{true, []string{"allgather", "--quiet", "-b", "8", "-e", "8", "--warmup", huge}, "allgather: --warmup " + huge + ": want 1 to 200000"},
		{false, []string{"link", "--iters", huge}, "link: --iters " + huge + ": want 1 to 200000"},
		{false, append([]string{"overlap", "--iters", huge}, small...), "overlap: --iters " + huge + ": want 1 to 200000"},
		{true, append([]string{"overlap", "--iters", "1000000000"}, small...), "overlap: --iters 1000000000: want 1 to 200000"},
		{true, []string{"overlap", "--m-min", "1048576", "--m-max", "1048576", "--nk", "16384", "--iters", "1", "--cpu-window", "0", "--quiet"},
			"overlap: --m-max 1048576, --nk 16384: the matrices of m=1048576 n=16384 k=16384 float32 for 2 rank(s) of 2 here need"},
		{false, []string{"overlap", "--in-process", "2", "--m-min", "1024", "--m-max", "1048576", "--nk", "512,1048576", "--dtype", "float32,float64", "--iters", "1", "--cpu-window", "0", "--quiet"},
			"overlap: --m-max 1048576, --nk 1048576: the matrices of m=1048576 n=1048576 k=1048576 float64 for 2 rank(s) of 2 here need"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			argv := append([]string{bin}, tc.args...)
			if tc.launched {
				argv = append([]string{slimerun, "-q", "--standalone", "--nproc-per-node", "2"}, argv...)
			}
			argv = append([]string{"sh", "-c", `ulimit -v 16000000 && exec "$@"`, "sh"}, argv...)
			out, code := testbin.Run(t, 30*time.Second, []string{"SLIME_JOB_SECRET=slimebench-test"}, argv...)
			if crashed(out) || !strings.Contains(out, tc.want) {
				t.Fatalf("exit %d, want a refusal saying %q:\n%s", code, tc.want, out)
			}
			if !tc.launched {
				if code != 2 || strings.Count(strings.TrimSpace(out), "\n") != 0 {
					t.Fatalf("exit %d, want exit 2 and one line:\n%s", code, out)
				}
				return
			}
			for _, r := range []string{"[0]: ", "[1]: "} {
				if !strings.Contains(out, r+"slimebench: "+tc.want) {
					t.Errorf("rank %s said nothing of it:\n%s", strings.Trim(r, "[]: "), out)
				}
			}
			if !strings.Contains(out, "exited with code 2") {
				t.Errorf("no rank exited with code 2:\n%s", out)
			}
		})
	}
}

// TestHelpDefaults: the sweep flags' help says what a run without them
// measures (BENCHMARKS.md's size list, or tcp's and link's), and shows no
// default values: giving those would sweep a ×8 grid instead.
func TestHelpDefaults(t *testing.T) {
	bin := slimebench(t)
	const bench, link = "8, 64, 512, 4K, 32K, 256K, 1M, 4M, 16M, 64M", "are 1M, 4M, 16M, 64M;"
	for _, tc := range []struct{ cmd, list string }{
		{"allgather", bench}, {"memcpy", bench}, {"d2d", bench}, {"tcp", link}, {"link", link},
	} {
		t.Run(tc.cmd, func(t *testing.T) {
			out, code := run(t, bin, tc.cmd, "--help")
			if code != 0 {
				t.Fatalf("exit %d:\n%s", code, out)
			}
			for _, l := range strings.Split(out, "\n") {
				if strings.Contains(l, "-bytes") || strings.Contains(l, "--step-factor") {
					if strings.Contains(l, "(default ") {
						t.Errorf("a default that a run without the flag does not sweep: %s", strings.TrimSpace(l))
					}
				}
			}
			if !strings.Contains(out, tc.list) {
				t.Errorf("the help does not name the sizes %s:\n%s", tc.list, out)
			}
		})
	}
}
