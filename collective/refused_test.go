package collective_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/internal/pattern"
)

// TestRefusedOnOneRank: a call that one rank refuses as a bad argument
// (a destination too short, counts that do not add up, a source that
// does not fit) still takes part, as a call that differs: every other
// rank fails the same call, naming that rank and its reason, and the
// next call pairs with the next call on every rank, its data checked
// byte for byte. Passed on every rank, the bad argument fails on every
// rank and moves nothing. Within a node (shared memory), across nodes
// (the ring, and the hierarchical all-gather).
func TestRefusedOnOneRank(t *testing.T) {
	const n = 8
	bad := map[string]func(c *collective.Communicator, ctx context.Context) error{
		"short-dst": func(c *collective.Communicator, ctx context.Context) error {
			return c.AllGather(ctx, make([]byte, n), make([]byte, n))
		},
		"counts": func(c *collective.Communicator, ctx context.Context) error {
			return c.AllGatherV(ctx, make([]byte, n*c.Size()), make([]byte, n), make([]int, c.Size()+1))
		},
		"src": func(c *collective.Communicator, ctx context.Context) error {
			counts := make([]int, c.Size())
			for i := range counts {
				counts[i] = n
			}
			return c.AllGatherV(ctx, make([]byte, n*c.Size()), make([]byte, n-1), counts)
		},
	}
	for _, layout := range [][2]int{{1, 3}, {3, 1}, {2, 2}} {
		for what, call := range bad {
			for _, all := range []bool{false, true} {
				name := fmt.Sprintf("%dx%d/%s/one", layout[0], layout[1], what)
				if all {
					name = fmt.Sprintf("%dx%d/%s/all", layout[0], layout[1], what)
				}
				t.Run(name, func(t *testing.T) {
					inProcessNodes(t, layout[0], layout[1], nil, func(c *collective.Communicator) error {
						ctx := context.Background()
						me, P := c.Rank(), c.Size()
						src, dst := make([]byte, n), make([]byte, n*P)
						for it := range 3 {
							pattern.Fill(src, pattern.Seed(me, it, 0))
							var err error
							if it == 1 && (all || me == 1) {
								err = call(c, ctx)
							} else {
								err = c.AllGather(ctx, dst, src)
							}
							if it != 1 {
								if err != nil {
									return fmt.Errorf("call %d: %w", it, err)
								}
								for r := range P {
									if i := pattern.Check(dst[r*n:r*n+n], pattern.Seed(r, it, 0)); i >= 0 {
										return fmt.Errorf("call %d: rank %d's block wrong at byte %d (the calls paired out of step)", it, r, i)
									}
								}
								continue
							}
							var oe *collective.OpError
							if !errors.Is(err, collective.ErrInvalid) || !errors.As(err, &oe) {
								return fmt.Errorf("call 1 (rank 1 refuses it): %v, want ErrInvalid", err)
							}
							if !all && me != 1 && (oe.Peer != 1 || !strings.Contains(oe.Detail, "rank 1 refused")) {
								return fmt.Errorf("call 1: %v, want it to name rank 1, which refused the call", err)
							}
						}
						return nil
					})
				})
			}
		}
	}
}
