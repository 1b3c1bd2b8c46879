package launcher

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSignalBetweenAttempts: a signal that arrives after an attempt's
// workers have all ended, before the launcher restarts them, stops the job
// there: no worker of the next attempt starts, and the error is the
// interruption (slimerun exits 128+signal), naming the failure before it.
func TestSignalBetweenAttempts(t *testing.T) {
	betweenAttempts = func(_ int, sigs chan<- os.Signal) {
		betweenAttempts = nil // the first attempt's end only
		sigs <- syscall.SIGTERM
	}
	t.Cleanup(func() { betweenAttempts = nil })
	out, _, err := run(t, Config{NProcPerNode: 2, MaxRestarts: 3},
		`echo attempt=$TORCHELASTIC_RESTART_COUNT; exit 3`)
	var ie *ErrInterrupted
	if !errors.As(err, &ie) || ie.Signal != syscall.SIGTERM || !strings.Contains(err.Error(), "exit") {
		t.Errorf("err = %v; want an interruption by SIGTERM naming the first attempt's failure", err)
	}
	if !strings.Contains(out, "attempt=0") || strings.Contains(out, "attempt=1") {
		t.Errorf("a worker of the next attempt started after the signal:\n%s", out)
	}
}

// TestCancelBetweenAttempts: a Run whose context is cancelled after an
// attempt's workers have all ended, before it restarts them, stops the
// job there, as a signal does: no worker of the next attempt starts.
// Before, the next attempt's workers started and were stopped at once
// (here they ignore SIGTERM, so they say that they started).
func TestCancelBetweenAttempts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	betweenAttempts = func(int, chan<- os.Signal) {
		betweenAttempts = nil // the first attempt's end only
		cancel()
	}
	t.Cleanup(func() { betweenAttempts = nil })
	var out syncBuffer
	err := Run(ctx, Config{Standalone: true, NProcPerNode: 1, MaxRestarts: 3, StopGrace: time.Second,
		Program: "sh", Args: []string{"-c", `trap '' TERM; echo attempt=$TORCHELASTIC_RESTART_COUNT; exit 3`}, Stdout: &out, Stderr: &out})
	var ie *ErrInterrupted
	if !errors.As(err, &ie) || !strings.Contains(err.Error(), "exit") {
		t.Errorf("err = %v; want an interruption naming the first attempt's failure", err)
	}
	if !strings.Contains(out.String(), "attempt=0") || strings.Contains(out.String(), "attempt=1") {
		t.Errorf("a worker of the next attempt started after the cancel:\n%s", out.String())
	}
}
