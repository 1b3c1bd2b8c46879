package launcher

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// brokenPipe is a console whose reader has gone (slimerun ... | head):
// every write fails with EPIPE.
type brokenPipe struct{}

func (brokenPipe) Write([]byte) (int, error) { return 0, syscall.EPIPE }

// TestConsoleGoneWarned: when the console's standard output goes away,
// the workers go on (their output must not kill them) and their console
// output is dropped, as before, but the launcher says so once on
// standard error rather than drop it without a word.
func TestConsoleGoneWarned(t *testing.T) {
	var errb syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := Run(ctx, Config{NProcPerNode: 2, Standalone: true, StopGrace: time.Second,
		Program: "sh", Args: []string{"-c", "for i in 1 2 3; do echo line $i; done"},
		Env: []string{"PATH=" + os.Getenv("PATH")}, Stdout: brokenPipe{}, Stderr: &errb})
	if err != nil {
		t.Fatalf("the workers must not fail for a console gone: %v\n%s", err, errb.String())
	}
	if n := strings.Count(errb.String(), "standard output is gone"); n != 1 {
		t.Errorf("%d warnings of the console gone, want 1:\n%s", n, errb.String())
	}
}
