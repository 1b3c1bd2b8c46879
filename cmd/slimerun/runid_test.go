package main

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestBadRunIDRefused: an --rdzv-id that cannot name the job's shared
// memory (a byte other than letters, digits, '.', '_', '-', a "..", too
// long) is refused with exit 2 before any worker starts. (The workers
// started, and every one failed in Init, "unacceptable segment name"; with
// --redirects, "../x" put the logs outside --log-dir.) A plain one runs.
func TestBadRunIDRefused(t *testing.T) {
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{"job-1.2_x", true},
		{strings.Repeat("a", 128), true},
		{"a/b", false},
		{"../x", false},
		{"my job", false},
		{"a..b", false},
		{strings.Repeat("a", 129), false},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := exec.CommandContext(ctx, slimerun, "--standalone", "--nproc-per-node", "2", "--rdzv-id", tc.id,
			"--log-dir", t.TempDir(), "--redirects", "1", "sh", "-c", "echo ran >&2").CombinedOutput()
		cancel()
		if tc.ok {
			if err != nil || !strings.Contains(string(out), "[0]: ran") {
				t.Errorf("--rdzv-id %q: err %v, want the job run\n%s", tc.id, err, out)
			}
			continue
		}
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "--rdzv-id") || strings.Contains(string(out), "ran") {
			t.Errorf("--rdzv-id %q: err %v, want exit 2 naming --rdzv-id before any worker ran\n%s", tc.id, err, out)
		}
	}
}
