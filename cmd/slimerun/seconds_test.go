package main

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestDurationsInSeconds: torchrun's --monitor-interval is a number of
// seconds (--monitor-interval 0.1, --monitor_interval=5); slimerun takes
// that as well as a Go duration, for its other durations too. (Every bare
// number was refused, exit 2: "must be a duration like 30s".) A number
// that is no duration is still refused, naming the flag.
func TestDurationsInSeconds(t *testing.T) {
	for _, tc := range []struct {
		args []string
		bad  string // "" when the job runs
	}{
		{[]string{"--monitor-interval", "0.1"}, ""},
		{[]string{"--monitor_interval=5"}, ""},
		{[]string{"--monitor-interval", "50ms"}, ""},
		{[]string{"--stop-grace", "2", "--rdzv-timeout", "30"}, ""},
		{[]string{"--monitor-interval", "0"}, "--monitor-interval 0s: want a positive duration"},
		{[]string{"--monitor-interval", "-0.5"}, "--monitor-interval -500ms: want a positive duration"},
		{[]string{"--monitor-interval", "NaN"}, `invalid argument "NaN" for "--monitor-interval"`},
		{[]string{"--stop-grace", "Inf"}, `invalid argument "Inf" for "--stop-grace"`},
		{[]string{"--rdzv-timeout", "1e300"}, `invalid argument "1e300" for "--rdzv-timeout"`},
		// Rounds to 2^63 ns, one past the largest duration.
		{[]string{"--rdzv-timeout", "9223372036.8547758"}, `invalid argument "9223372036.8547758" for "--rdzv-timeout"`},
		{[]string{"--rdzv-timeout", "soon"}, `invalid argument "soon" for "--rdzv-timeout"`},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		args := append(append([]string{"-q", "--standalone"}, tc.args...), "sh", "-c", "echo ran")
		out, err := exec.CommandContext(ctx, slimerun, args...).CombinedOutput()
		cancel()
		if tc.bad == "" {
			if err != nil || !strings.Contains(string(out), "[0]: ran") {
				t.Errorf("%v: err %v, want the job run\n%s", tc.args, err, out)
			}
			continue
		}
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), tc.bad) || strings.Contains(string(out), "ran") {
			t.Errorf("%v: err %v, want exit 2 saying %q\n%s", tc.args, err, tc.bad, out)
		}
	}
}
