package main

import (
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/slimego/slimego/internal/machine"
	"github.com/slimego/slimego/internal/testbin"
	"github.com/spf13/pflag"
)

// slimebench returns the built slimebench binary.
func slimebench(t *testing.T) string {
	t.Helper()
	dir, err := testbin.Build()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "slimebench")
}

// crashed says whether out shows a panic or the runtime's fatal error.
func crashed(out string) bool {
	return strings.Contains(out, "panic") || strings.Contains(out, "fatal error") || strings.Contains(out, "goroutine ")
}

// TestBadFlags: every subcommand refuses a nonsense flag, value or
// argument before it measures anything, with exit 2 and one line that
// names the flag (or the arguments), and never crashes. The commands run
// without a launcher: nothing here gets as far as starting a world.
func TestBadFlags(t *testing.T) {
	bin := slimebench(t)
	threads := strconv.Itoa(min(2, machine.OnlineCPUs()))
	const huge, half = "4611686018427387904", "2305843009213693952" // 2^62, 2^61 bytes
	for _, tc := range []struct {
		args []string
		want string
	}{
		// 1: flags the parser refuses.
		{[]string{"allgather", "--bogus"}, "allgather: unknown flag: --bogus"},
		{[]string{"memcpy", "--bogus"}, "memcpy: unknown flag: --bogus"},
		{[]string{"tcp", "--bogus"}, "tcp: unknown flag: --bogus"},
		{[]string{"link", "--bogus"}, "link: unknown flag: --bogus"},
		{[]string{"p2p", "--bogus"}, "p2p: unknown flag: --bogus"},
		{[]string{"d2d", "--bogus"}, "d2d: unknown flag: --bogus"},
		{[]string{"overlap", "--bogus"}, "overlap: unknown flag: --bogus"},
		{[]string{"gemm", "--bogus"}, "gemm: unknown flag: --bogus"},
		{[]string{"compare", "--bogus"}, "compare: unknown flag: --bogus"},
		{[]string{"memcpy", "--threads", "x"}, `invalid argument "x" for "--threads"`},
		{[]string{"allgather", "-b", "2K", "-e", "1K"}, "--min-bytes 2K, --max-bytes 1K"},
		{[]string{"allgather", "-b", "8x"}, `--min-bytes "8x"`},
		{[]string{"compare"}, "compare: want CSV files of at least two implementations"},
		{[]string{"p2p", "--batch", "0"}, "--batch 0: want 1 to 4096"},
		// 2: values that crashed.
		{[]string{"tcp", "--channels", "0"}, "tcp: --channels 0: want 1 to 64"},
		{[]string{"tcp", "--channels", "-1"}, "tcp: --channels -1: want 1 to 64"},
		{[]string{"tcp", "--channels", "1,65"}, "tcp: --channels 65: want 1 to 64"},
		{[]string{"link", "--channels", "65"}, "link: --channels 65: want 1 to 64 (0: the default)"},
		{[]string{"allgather", "--channels", "100"}, "allgather: --channels 100: want 1 to 64 (0: the default)"},
		{[]string{"gemm", "--size", "-5"}, "gemm: --size -5: want a positive size"},
		{[]string{"gemm", "--size", "0"}, "gemm: --size 0: want a positive size"},
		{[]string{"gemm", "--size", "100000000"}, "gemm: --size 100000000: its three float64 matrices need"},
		{[]string{"memcpy", "-b", huge, "-e", huge}, "memcpy: --max-bytes " + huge + ":"},
		{[]string{"memcpy", "-b", huge, "-e", huge, "--gather", "--threads", threads}, "memcpy: --max-bytes " + huge + ":"},
		{[]string{"allgather", "--in-process", "2", "-b", half, "-e", half, "--buffers", "plain"}, "allgather: --max-bytes " + half + ":"},
		{[]string{"allgather", "--in-process", "2", "-b", huge, "-e", huge}, "allgather: --max-bytes " + huge + ":"},
		{[]string{"allgather", "-b", "1048576G", "-e", "1048576G"}, "allgather: --max-bytes 1048576G:"},
		{[]string{"tcp", "-b", "1048576G", "-e", "1048576G"}, "tcp: --max-bytes 1048576G: a send and a receive buffer per rank here need"},
		{[]string{"link", "-b", "1048576G", "-e", "1048576G"}, "link: --max-bytes 1048576G: a gather's buffers and a send and a receive buffer per rank here need"},
		// 3: --in-process out of range.
		{[]string{"allgather", "--in-process", "99999999999"}, "allgather: --in-process 99999999999: want 1 to 1024"},
		{[]string{"allgather", "--in-process", "100000"}, "allgather: --in-process 100000: want 1 to 1024"},
		{[]string{"allgather", "--in-process", "-1"}, "allgather: --in-process -1: want 1 to 1024"},
		{[]string{"overlap", "--in-process", "-1"}, "overlap: --in-process -1: want 1 to 1024"},
		// 4: nonsense that ran.
		{[]string{"allgather", "--iters", "-5"}, "allgather: --iters -5: want 1 to 200000 (0: at least 5 and 0.2 s)"},
		{[]string{"allgather", "--warmup", "-5"}, "allgather: --warmup -5: want 1 to 200000 (0: at least 5 and 0.1 s)"},
		{[]string{"allgather", "--channels", "-3"}, "allgather: --channels -3: want 1 to 64 (0: the default)"},
		{[]string{"allgather", "--csv", "--json"}, "allgather: --csv and --json: choose one"},
		{[]string{"allgather", "--mode", "both"}, `allgather: --mode "both": want intra, inter or auto`},
		{[]string{"overlap", "--mode", "x"}, `overlap: --mode "x": want intra, inter or auto`},
		{[]string{"allgather", "--buffers", "x"}, `allgather: --buffers "x": want symmetric or plain`},
		// Refused before Init, naming the flag (Init's refusal did not).
		{[]string{"allgather", "--algo", "tree"}, `allgather: --algo "tree": want auto, hier or ring`},
		{[]string{"allgather", "--in-process", "2", "--algo", "tree"}, `allgather: --algo "tree": want auto, hier or ring`},
		// Refused before the ranks meet (it was refused by both ranks of
		// a launched job, exit 1, and not at all without one).
		{[]string{"p2p", "--register", "6K"}, `p2p: --register "6K": want 0 (none) or a multiple of 4 KiB, at least 8 KiB`},
		{[]string{"p2p", "--register", "4K"}, `p2p: --register "4K": want 0 (none) or a multiple of 4 KiB, at least 8 KiB`},
		{[]string{"p2p", "--register", "-8K"}, `p2p: --register "-8K"`},
		// A 0-byte operation, which the engine refuses mid-run (exit 1,
		// "a length of 0"), after both ranks had met.
		{[]string{"p2p", "-b", "0", "-e", "4K"}, "p2p: --min-bytes 0: want 1 byte or more"},
		{[]string{"allgather", "foo", "bar"}, `allgather: unexpected arguments ["foo" "bar"]`},
		{[]string{"memcpy", "foo"}, `memcpy: unexpected arguments ["foo"]`},
		{[]string{"tcp", "foo"}, `tcp: unexpected arguments ["foo"]`},
		{[]string{"link", "foo"}, `link: unexpected arguments ["foo"]`},
		{[]string{"d2d", "foo"}, `d2d: unexpected arguments ["foo"]`},
		{[]string{"overlap", "foo"}, `overlap: unexpected arguments ["foo"]`},
		{[]string{"gemm", "foo"}, `gemm: unexpected arguments ["foo"]`},
		{[]string{"link", "--channels", "-1"}, "link: --channels -1: want 1 to 64 (0: the default)"},
		{[]string{"link", "--iters", "-1"}, "link: --iters -1: want 1 to 200000"},
		{[]string{"link", "--iters", "0"}, "link: --iters 0: want 1 to 200000"},
		{[]string{"link", "--min-time", "-1s"}, "link: --min-time -1s: want 0 or more"},
		{[]string{"overlap", "--n", "-5"}, "overlap: --n -5: want 1 or more (0: n = k)"},
		{[]string{"overlap", "--pieces", "0"}, "overlap: --pieces 0: want 1 or more"},
		{[]string{"overlap", "--pieces", "-2"}, "overlap: --pieces -2: want 1 or more"},
		{[]string{"overlap", "--iters", "0"}, "overlap: --iters 0: want 1 to 200000"},
		{[]string{"overlap", "--iters", "-1"}, "overlap: --iters -1: want 1 to 200000"},
		{[]string{"overlap", "--cpu-window", "-1s"}, "overlap: --cpu-window -1s: want 0 (skip) or more"},
		{[]string{"overlap", "--nk", "0"}, "overlap: --nk 0: want 1 or more"},
		{[]string{"overlap", "--nk", "512,-3"}, "overlap: --nk -3: want 1 or more"},
		{[]string{"overlap", "--m-min", "64", "--m-max", "32"}, "overlap: --m-min 64 and --m-max 32: want --m-min at most --m-max"},
		{[]string{"overlap", "--m-min", "0"}, "overlap: --m-min 0: want 1 or more"},
		{[]string{"overlap", "--dtype", ""}, `overlap: --dtype "": want float32 or float64`},
		{[]string{"overlap", "--dtype", "float16"}, `overlap: --dtype "float16": want float32 or float64`},
		{[]string{"overlap", "--dtype", "float32,float16"}, `overlap: --dtype "float16": want float32 or float64`},
		// 5: the plot's directory, up front.
		{[]string{"overlap", "--plot", "/proc/nope/x.png"}, "overlap: --plot /proc/nope/x.png: its directory is not writable"},
		// 6: threads.
		{[]string{"memcpy", "--threads", "0"}, "memcpy: --threads 0: want 1 to"},
		{[]string{"memcpy", "--threads", "-1"}, "memcpy: --threads -1: want 1 to"},
		{[]string{"memcpy", "--threads", strconv.Itoa(machine.OnlineCPUs() + 1)}, "memcpy: --threads " + strconv.Itoa(machine.OnlineCPUs()+1) + ": want 1 to " + strconv.Itoa(machine.OnlineCPUs()) + ", this machine's online CPUs"},
		{[]string{"memcpy", "--gather", "--threads", strconv.Itoa(machine.OnlineCPUs() + 1)}, "this machine's online CPUs"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			out, code := run(t, append([]string{bin}, tc.args...)...)
			if code != 2 || !strings.Contains(out, tc.want) || crashed(out) {
				t.Fatalf("exit %d, want exit 2 saying %q:\n%s", code, tc.want, out)
			}
			if lines := strings.Count(strings.TrimSpace(out), "\n") + 1; lines != 1 {
				t.Errorf("%d lines, want one:\n%s", lines, out)
			}
		})
	}
}

// TestExitCodes: --help succeeds for every command, a usage error exits 2
// and a failure of the work itself exits 1.
func TestExitCodes(t *testing.T) {
	bin := slimebench(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"allgather", "--help"}, 0, "--in-process"},
		{[]string{"memcpy", "--help"}, 0, "--threads"},
		{[]string{"tcp", "-h"}, 0, "--channels"},
		{[]string{"link", "--help"}, 0, "--min-time"},
		{[]string{"p2p", "--help"}, 0, "--concurrency"},
		{[]string{"d2d", "--help"}, 0, "--device"},
		{[]string{"overlap", "--help"}, 0, "--pieces"},
		{[]string{"gemm", "--help"}, 0, "--size"},
		{[]string{"compare", "--help"}, 0, "slimebench compare"},
		{[]string{"--help"}, 0, "commands:"},
		{nil, 2, "commands:"},
		{[]string{"p2pp"}, 2, `unknown command "p2pp"`},
		{[]string{"compare", "/nonexistent/a.csv", "/nonexistent/b.csv"}, 1, "/nonexistent/a.csv"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			out, code := run(t, append([]string{bin}, tc.args...)...)
			if code != tc.code || !strings.Contains(out, tc.want) || crashed(out) {
				t.Fatalf("exit %d, want %d saying %q:\n%s", code, tc.code, tc.want, out)
			}
		})
	}
}

// TestSweepBounds: bounds alone sweep BENCHMARKS.md's sizes between them and
// the bounds themselves (-e 64M alone was a ×8 grid that skipped 1M, 4M
// and 64M); a step factor gives nccl-tests' grid, up to the bound.
func TestSweepBounds(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []int64
	}{
		{nil, defaultSizes},
		{[]string{"-e", "64M"}, defaultSizes},
		{[]string{"-e", "1M"}, defaultSizes[:7]},
		{[]string{"-b", "4K", "-e", "100K"}, []int64{4096, 32768, 102400}},
		{[]string{"-b", "8", "-e", "8"}, []int64{8}},
		{[]string{"-b", "8", "-e", "64K", "-f", "8"}, []int64{8, 64, 512, 4096, 32768}},
	} {
		fs := pflag.NewFlagSet("slimebench allgather", pflag.ContinueOnError)
		sw := sweepFlags(fs, defaultSizes)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		got, err := sw.sizes()
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%v: %v, %v; want %v", tc.args, got, err, tc.want)
		}
	}
}
