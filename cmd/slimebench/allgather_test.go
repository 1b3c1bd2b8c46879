package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/testbin"
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

// TestTitleLaunchIsThePlans: the table's title says how the plans ran
// (their mode, the CSV's mode column after the slash), not "graph" for
// every CUDA run: across nodes the GPU all-gather runs staged, which no
// graph captures, and the title said launch=graph above rows whose CSV
// said inter/staged (overlap's title alike). Two nodes of this host (two
// slimeruns on loopback), one rank each, on the emulated CUDA library.
func TestTitleLaunchIsThePlans(t *testing.T) {
	if err := device.UseEmulator(0); err != nil {
		t.Skip("no emulated CUDA library:", err)
	}
	bin := slimebench(t)
	slimerun := filepath.Join(filepath.Dir(bin), "slimerun")
	for _, format := range []string{"table", "csv", "overlap"} {
		t.Run(format, func(t *testing.T) {
			port := strconv.Itoa(testbin.FreePort(t))
			argv := func(node string) []string {
				a := []string{slimerun, "-q", "--nnodes", "2", "--node-rank", node, "--master-addr", "127.0.0.1", "--master-port", port,
					"--nproc-per-node", "1", bin, "allgather", "--backend", "cuda", "-b", "4K", "-e", "4K", "--iters", "2", "--warmup", "1", "--quiet"}
				if format == "csv" {
					a = append(a, "--csv")
				}
				if format == "overlap" {
					a = append(a[:len(a)-12], "overlap", "--backend", "cuda", "--m-min", "8", "--m-max", "8", "--nk", "16", "--iters", "1", "--cpu-window", "0", "--quiet")
				}
				return a
			}
			// Node 1 on a goroutine of its own, bounded as run bounds node 0
			// (run fails the test, which only the test's goroutine may).
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			a := argv("1")
			node1 := exec.CommandContext(ctx, a[0], a[1:]...)
			node1.Env = append(os.Environ(), "SLIME_JOB_SECRET=slimebench-test")
			node1.WaitDelay = 5 * time.Second
			other := make(chan string, 1)
			go func() {
				b, err := node1.CombinedOutput()
				other <- fmt.Sprintf("node 1: %v\n%s", err, b)
			}()
			out, code := run(t, argv("0")...)
			out1 := <-other
			if code != 0 || crashed(out) {
				t.Fatalf("node 0: exit %d:\n%s\n%s", code, out, out1)
			}
			if format == "csv" {
				if !strings.Contains(out, ",inter/staged,") {
					t.Fatalf("the rows' mode is not inter/staged:\n%s", out)
				}
				return
			}
			title, _, _ := strings.Cut(out, "\n")
			if !strings.Contains(title, " launch=staged") {
				t.Errorf("title %q, want launch=staged (the plans' mode across nodes)", title)
			}
		})
	}
}
