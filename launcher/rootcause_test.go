package launcher

import (
	"syscall"
	"testing"
)

// TestRootCause: among the failures seen before anyone was stopped, a
// worker killed by a signal is the likeliest cause (the others exited
// over its loss), except SIGABRT, which a survivor raises itself when it
// notices a lost peer (a collective library's abort): that one does not
// win over an exit reported before it.
func TestRootCause(t *testing.T) {
	exit := func(rank, code int) error { return &WorkerError{Rank: rank, ExitCode: code} }
	sig := func(rank int, s syscall.Signal) error { return &WorkerError{Rank: rank, ExitCode: -1, Signal: s} }
	for _, tc := range []struct {
		name     string
		failures []error
		want     int // the rank blamed
	}{
		{"first exit", []error{exit(2, 1), exit(0, 3)}, 2},
		{"killed before", []error{sig(1, syscall.SIGKILL), exit(0, 1)}, 1},
		{"killed after", []error{exit(0, 1), sig(1, syscall.SIGKILL)}, 1},
		{"segfault after", []error{exit(0, 1), sig(3, syscall.SIGSEGV)}, 3},
		{"a survivor's abort after the exit", []error{exit(0, 1), sig(1, syscall.SIGABRT)}, 0},
		{"abort first", []error{sig(1, syscall.SIGABRT), exit(0, 1)}, 1},
		{"abort, then a kill", []error{sig(1, syscall.SIGABRT), exit(0, 1), sig(2, syscall.SIGKILL)}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := rootCause(tc.failures).(*WorkerError)
			if got.Rank != tc.want {
				t.Fatalf("blamed rank %d (%v), want rank %d", got.Rank, got, tc.want)
			}
		})
	}
}
