package main

import (
	"fmt"
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

// TestBadFlags: the examples refuse a flag out of range, and a size
// beyond memory, before they start, with one line naming the flag and
// exit code 2 (as pflag refuses a flag it cannot parse), never a panic.
func TestBadFlags(t *testing.T) {
	dir, err := testbin.Build()
	if err != nil {
		t.Fatal(err)
	}
	// A layout, so that the size checks know the world (the store is
	// never reached: the flags fail first).
	env := []string{"WORLD_SIZE=2", "RANK=0", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=9", "SLIME_JOB_SECRET=x"}
	huge := fmt.Sprint(1 << 40)
	for _, tc := range []struct {
		prog string
		args []string
		flag string
	}{
		{"allgather", []string{"--m", "-1"}, "--m -1"},
		{"allgather", []string{"--n", "0"}, "--n 0"},
		{"allgather", []string{"--iters", "0"}, "--iters 0"},
		{"allgather", []string{"--mode", "x"}, "--mode"},
		{"allgather", []string{"--m", huge, "--n", huge}, "--m " + huge},
		{"allgather_gemm", []string{"--m", "-1"}, "--m -1"},
		{"allgather_gemm", []string{"--k", "0"}, "--k 0"},
		{"allgather_gemm", []string{"--iters", "-1"}, "--iters -1"},
		{"allgather_gemm", []string{"--pieces", "-1"}, "--pieces -1"},
		{"allgather_gemm", []string{"--min-piece", "-1"}, `--min-piece "-1"`},
		{"allgather_gemm", []string{"--min-piece", "2X"}, `--min-piece "2X"`},
		{"allgather_gemm", []string{"--dtype", "int8"}, "--dtype"},
		{"allgather_gemm", []string{"--m", huge, "--n", "1", "--k", "1"}, "--m " + huge},
	} {
		t.Run(tc.prog+" "+strings.Join(tc.args, " "), func(t *testing.T) {
			out, code := testbin.Run(t, 30*time.Second, env, append([]string{filepath.Join(dir, tc.prog)}, tc.args...)...)
			if code != 2 || strings.Contains(out, "panic") || strings.Count(strings.TrimSpace(out), "\n") != 0 || !strings.Contains(out, tc.flag) {
				t.Fatalf("exit %d, output:\n%s\nwant exit 2 and one line naming %s", code, out, tc.flag)
			}
		})
	}
}
