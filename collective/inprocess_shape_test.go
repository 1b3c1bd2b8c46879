package collective_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/slimego/slimego/collective"
)

// TestRunInProcessBadShape: a job of no ranks, or of a negative count of
// nodes or ranks per node, is refused with one ErrInvalid naming the
// shape, and body never runs (a negative count panicked making the
// error slice; zero nodes returned no error at all).
func TestRunInProcessBadShape(t *testing.T) {
	for _, tc := range []struct{ nodes, perNode int }{{-1, 2}, {0, 2}, {2, 0}, {1, -3}, {-2, -2}, {1 << 40, 1 << 40}} {
		t.Run(fmt.Sprintf("%dx%d", tc.nodes, tc.perNode), func(t *testing.T) {
			ran := false
			var errs []error
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("RunInProcess(%d, %d) panicked: %v", tc.nodes, tc.perNode, r)
					}
				}()
				errs = collective.RunInProcess(context.Background(), tc.nodes, tc.perNode, nil, func(*collective.Communicator) error {
					ran = true
					return nil
				})
			}()
			if ran {
				t.Error("body ran")
			}
			if len(errs) != 1 || !errors.Is(errs[0], collective.ErrInvalid) {
				t.Fatalf("RunInProcess(%d, %d) = %v, want one ErrInvalid", tc.nodes, tc.perNode, errs)
			}
		})
	}
}
