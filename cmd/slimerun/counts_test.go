package main

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/testbin"
)

// TestHugeCountsRefused: node and worker counts no job can run (past the
// store's barrier of at most 65535 members, or whose product overflows)
// are refused with exit 2 naming the flag, before anything is started.
// (--redirects with such a --nproc-per-node made a slice of that many
// entries: the runtime died out of memory; such an --nnodes died in node
// 0's barrier, out of memory or "makeslice: len out of range", and
// --force made the workers' table.)
func TestHugeCountsRefused(t *testing.T) {
	port := strconv.Itoa(testbin.FreePort(t))
	multi := []string{"--master-addr", "127.0.0.1", "--master-port", port, "--rdzv-timeout", "5s"}
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--standalone", "--nproc-per-node", "9999999999999", "--redirects", "3", "true"}, "--nproc-per-node"},
		{[]string{"--standalone", "--nproc-per-node", "9999999999999", "--tee", "0:1", "--force", "true"}, "--nproc-per-node"},
		{append(append([]string{"--nnodes", "99999999999"}, multi...), "true"), "--nnodes"},
		{append(append([]string{"--nnodes", "70000"}, multi...), "true"), "--nnodes"},
		{append(append([]string{"--nnodes", "4611686018427387904", "--nproc-per-node", "4"}, multi...), "true"), "--nnodes"},
		{append(append([]string{"--nnodes", "40000", "--nproc-per-node", "2"}, multi...), "true"), "workers"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, slimerun, tc.args...)
		cmd.Env = append(os.Environ(), "SLIME_JOB_SECRET=huge")
		out, err := cmd.CombinedOutput()
		cancel()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), tc.msg) || strings.Contains(string(out), "goroutine ") {
			t.Errorf("%v: err %v, want exit 2 saying %q\n%.2000s", tc.args, err, tc.msg, out)
		}
	}
}
