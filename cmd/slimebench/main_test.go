package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/testbin"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

// run runs argv, bounded in time, with a job secret.
func run(t *testing.T, argv ...string) (string, int) {
	t.Helper()
	return testbin.Run(t, time.Minute, []string{"SLIME_JOB_SECRET=slimebench-test"}, argv...)
}

// TestP2PBadFlags: slimebench p2p refuses nonsense flags with an error
// that names the flag, before it measures anything, and never crashes
// (a panic, or the runtime out of memory); --help succeeds and an unknown
// command is named.
func TestP2PBadFlags(t *testing.T) {
	dir, err := testbin.Build()
	if err != nil {
		t.Fatal(err)
	}
	plotDir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--batch", "-1"}, "--batch -1: want 1 to 4096"},
		{[]string{"--batch", "5000"}, "--batch 5000: want 1 to 4096"},
		{[]string{"--concurrency", "0"}, "--concurrency 0: want 1 to 1024"},
		{[]string{"--concurrency", "-1"}, "--concurrency -1: want 1 to 1024"},
		{[]string{"--channels", "100"}, "--channels 100: want 1 to 64"},
		{[]string{"--min-time", "0s"}, "--min-time 0s: want a positive duration"},
		{[]string{"-f", "8abc"}, `--step-factor "8abc": want a finite number`},
		{[]string{"-f", "NaN"}, `--step-factor "NaN": want a finite number`},
		{[]string{"-f", "Inf"}, `--step-factor "Inf": want a finite number`},
		{[]string{"-b", "2K", "-e", "1K"}, "--min-bytes 2K, --max-bytes 1K"},
		{[]string{"--shared", "--tcp-only"}, "--tcp-only turns off"},
		{[]string{"--huge", "--shared"}, "one of --gpu, --shared, --symmetric and --huge: one kind of memory"},
		{[]string{"foo"}, `unexpected arguments ["foo"]`},
		{[]string{"--max-in-flight", "0"}, `--max-in-flight "0": want a positive size`},
		{[]string{"-b", "1024G", "-e", "1024G", "--max-in-flight", "1024G"}, "lower --max-bytes or --max-in-flight"},
		{[]string{"--register", "1024G"}, "more than this machine's memory"},
		{[]string{"--register", "6K"}, `p2p: --register "6K": want 0 (none) or a multiple of 4 KiB`},
		{[]string{"--register", "4K"}, `p2p: --register "4K": want 0 (none) or a multiple of 4 KiB, at least 8 KiB`},
		{[]string{"--plot", "/proc/no-such-dir/p.png"}, "--plot /proc/no-such-dir/p.png: its directory is not writable"},
		{[]string{"-e", "512", "--no-baselines", "--min-time", "10ms", "--plot", filepath.Join(plotDir, "p.png")}, "nothing to plot"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			argv := append([]string{filepath.Join(dir, "slimerun"), "-q", "--standalone", "--nproc-per-node", "2", filepath.Join(dir, "slimebench"),
				"p2p", "-b", "8", "--op", "read", "--batch", "1", "--concurrency", "1", "--register", "0", "--quiet"}, tc.args...)
			out, code := run(t, argv...)
			if code == 0 || !strings.Contains(out, tc.want) || strings.Contains(out, "panic") || strings.Contains(out, "fatal error") {
				t.Fatalf("exit %d, want a failure saying %q:\n%s", code, tc.want, out)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(plotDir, "p.png")); err == nil {
		t.Error("a plot of nothing left its file behind")
	}
	if out, code := run(t, filepath.Join(dir, "slimebench"), "p2p", "--help"); code != 0 || !strings.Contains(out, "--concurrency") {
		t.Errorf("p2p --help: exit %d:\n%s", code, out)
	}
	if out, code := run(t, filepath.Join(dir, "slimebench"), "p2pp"); code == 0 || !strings.Contains(out, `unknown command "p2pp"`) {
		t.Errorf("an unknown command: exit %d:\n%s", code, out)
	}
}

// TestP2PWorldOfOne: p2p without a launcher (a world of one) says at once
// that it needs two ranks, and says nothing else first (the sweep's notes
// of combinations skipped buried the reason under thirty lines).
func TestP2PWorldOfOne(t *testing.T) {
	dir, err := testbin.Build()
	if err != nil {
		t.Fatal(err)
	}
	out, code := run(t, filepath.Join(dir, "slimebench"), "p2p")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 1 || len(lines) != 1 || !strings.Contains(out, "two ranks measure a link; this job has 1") {
		t.Fatalf("exit %d, want 1 with one line saying it needs two ranks:\n%s", code, out)
	}
}

// TestP2PProgressWrong: the progress line of a row that checks no byte
// (raw TCP, memcpy) says "wrong -", as the table does, not "wrong 0"; the
// p2p rows, checked, say their count. A ping-pong's GB/s, which it does
// not measure, is "-" too, not 0.000.
func TestP2PProgressWrong(t *testing.T) {
	dir, err := testbin.Build()
	if err != nil {
		t.Fatal(err)
	}
	out, code := run(t, filepath.Join(dir, "slimerun"), "-q", "--standalone", "--nproc-per-node", "2", filepath.Join(dir, "slimebench"),
		"p2p", "-b", "64K", "-e", "64K", "--batch", "1", "--concurrency", "1", "--op", "read", "--register", "0", "--min-time", "1ms")
	if code != 0 || crashed(out) {
		t.Fatalf("exit %d, want 0:\n%s", code, out)
	}
	n := 0
	for _, l := range strings.Split(out, "\n") {
		_, l, ok := strings.Cut(l, "slimebench p2p: ")
		if !ok || !strings.Contains(l, " S=") {
			continue
		}
		n++
		checked := strings.HasPrefix(l, "p2p ")
		if checked && !strings.HasSuffix(l, " wrong 0") || !checked && !strings.HasSuffix(l, " wrong -") {
			t.Errorf("progress line %q: want wrong 0 for a p2p row, wrong - for a row that checks nothing", l)
		}
		if strings.Contains(l, " pingpong") && !strings.Contains(l, ": - GB/s") {
			t.Errorf("progress line %q: a ping-pong measures no GB/s, want -", l)
		}
	}
	if n == 0 {
		t.Fatalf("no progress lines:\n%s", out)
	}
}
