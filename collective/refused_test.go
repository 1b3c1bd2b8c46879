package collective_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

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
// (the hierarchical all-gather, and the ring).
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
	for _, layout := range []struct {
		nodes, perNode int
		algo           string
	}{{1, 3, ""}, {3, 1, ""}, {2, 2, ""}, {3, 1, "ring"}, {2, 2, "ring"}} {
		tune := func(o *collective.Options) { o.Algo = layout.algo }
		for what, call := range bad {
			for _, all := range []bool{false, true} {
				name := fmt.Sprintf("%dx%d%s/%s/one", layout.nodes, layout.perNode, layout.algo, what)
				if all {
					name = fmt.Sprintf("%dx%d%s/%s/all", layout.nodes, layout.perNode, layout.algo, what)
				}
				t.Run(name, func(t *testing.T) {
					inProcessNodes(t, layout.nodes, layout.perNode, tune, func(c *collective.Communicator) error {
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

// TestRefusedAlone: a refused call that no other rank makes waits, as any
// collective call does, for the communicator's timeout; the error then
// names the call this rank made (not the refusal's own name) and the
// reason it refused it.
func TestRefusedAlone(t *testing.T) {
	done := make(chan struct{})
	inProcessNodes(t, 1, 2, func(o *collective.Options) { o.Timeout = 2 * time.Second }, func(c *collective.Communicator) error {
		if c.Rank() == 0 {
			<-done // makes no call
			return nil
		}
		defer close(done)
		err := c.AllGather(context.Background(), make([]byte, 8), make([]byte, 8))
		var oe *collective.OpError
		if !errors.Is(err, collective.ErrTimeout) || !errors.As(err, &oe) || oe.Op != "allgather" || !strings.Contains(oe.Detail, "refused its call (destination holds 8 bytes") {
			return fmt.Errorf("a refused AllGather that rank 0 never makes: %v; want ErrTimeout from allgather with the reason", err)
		}
		return nil
	})
}
