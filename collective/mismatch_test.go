package collective_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/internal/pattern"
	"github.com/slimego/slimego/rendezvous"
)

// checkGather runs one agreeing AllGather of n random bytes per rank and
// checks every block byte for byte: the communicator is still usable.
func checkGather(ctx context.Context, c *collective.Communicator, n, it int) error {
	P, me := c.Size(), c.Rank()
	src, dst := make([]byte, n), make([]byte, P*n)
	pattern.Fill(src, pattern.Seed(me, it, 7))
	if err := c.AllGather(ctx, dst, src); err != nil {
		return fmt.Errorf("rank %d, afterwards: %v", me, err)
	}
	for r := range P {
		if i := pattern.Check(dst[r*n:r*n+n], pattern.Seed(r, it, 7)); i >= 0 {
			return fmt.Errorf("rank %d, afterwards: rank %d's block wrong at %d", me, r, i)
		}
	}
	return nil
}

// wantMismatch checks that err is ErrSizeMismatch as an *OpError naming
// peer and saying detail.
func wantMismatch(err error, me, peer int, detail string) error {
	var oe *collective.OpError
	if !errors.Is(err, collective.ErrSizeMismatch) || !errors.As(err, &oe) {
		return fmt.Errorf("rank %d: err = %v, want ErrSizeMismatch", me, err)
	}
	if oe.Rank != me || oe.Peer != peer || !strings.Contains(oe.Detail, detail) {
		return fmt.Errorf("rank %d: err = %v, want rank %d peer %d and %q", me, err, me, peer, detail)
	}
	return nil
}

// TestMismatchNamesTheRank: when one rank's call differs, every rank's
// ErrSizeMismatch names that rank and what differs in its call, in the
// same words everywhere (the peer is that rank, or on it the lowest rank
// of the others), and the communicator stays usable.
func TestMismatchNamesTheRank(t *testing.T) {
	ctx := context.Background()
	t.Run("counts", func(t *testing.T) {
		inProcess(t, 3, func(c *collective.Communicator) error {
			me := c.Rank()
			counts, peer := []int{4, 4, 4}, 1
			if me == 1 {
				counts, peer = []int{5, 4, 3}, 0
			}
			err := c.AllGatherV(ctx, make([]byte, 12), make([]byte, counts[me]), counts)
			if err := wantMismatch(err, me, peer, "rank 1's counts differ: it passed [5 4 3], ranks 0 and 2 [4 4 4]"); err != nil {
				return err
			}
			return checkGather(ctx, c, 1000, 0)
		})
	})
	t.Run("two-ranks-plan", func(t *testing.T) {
		inProcess(t, 2, func(c *collective.Communicator) error {
			me := c.Rank()
			n := 8 + me
			p, err := c.Plan(make([]byte, 2*n), make([]byte, n))
			if err != nil {
				return err
			}
			if err := wantMismatch(p.Run(ctx), me, 1-me, "rank 1 contributes 9 bytes, rank 0 8"); err != nil {
				return err
			}
			return checkGather(ctx, c, 5000, 1)
		})
	})
	t.Run("operation", func(t *testing.T) {
		inProcess(t, 3, func(c *collective.Communicator) error {
			me := c.Rank()
			var err error
			peer := 2
			if me == 2 {
				err, peer = c.Barrier(ctx), 0
			} else {
				err = c.AllGather(ctx, nil, nil)
			}
			if err := wantMismatch(err, me, peer, "rank 2 calls barrier, ranks 0 and 1 allgather"); err != nil {
				return err
			}
			return checkGather(ctx, c, 70_000, 2)
		})
	})
	for _, algo := range []string{"hier", "ring"} {
		t.Run("nodes-"+algo, func(t *testing.T) {
			inProcessNodes(t, 2, 2, func(o *collective.Options) { o.Algo = algo }, func(c *collective.Communicator) error {
				me := c.Rank()
				n, peer := 100, 3
				if me == 3 {
					n, peer = 101, 0
				}
				err := c.AllGather(ctx, make([]byte, 4*n), make([]byte, n))
				if err := wantMismatch(err, me, peer, "rank 3 contributes 101 bytes, ranks 0-2 100"); err != nil {
					return err
				}
				return checkGather(ctx, c, 300_001, 3)
			})
		})
	}
}

// TestMismatchKeysBounded: the store keys a mismatch's explanation leaves
// do not pile up: a communicator whose calls mismatch again and again
// holds two mismatches' keys at a time.
func TestMismatchKeysBounded(t *testing.T) {
	ctx := context.Background()
	var o collective.Options
	var once sync.Once
	counts := make(chan int64, 8)
	inProcessNodes(t, 1, 2, func(opts *collective.Options) { once.Do(func() { o = *opts }) }, func(c *collective.Communicator) error {
		me := c.Rank()
		var st *rendezvous.Client
		if me == 0 {
			job := o.JobID
			if job == "" {
				job = o.RunID
			}
			var err error
			if st, err = rendezvous.Dial(ctx, net.JoinHostPort(o.MasterAddr, strconv.Itoa(o.MasterPort)), rendezvous.Auth{Secret: o.JobSecret, Job: job}); err != nil {
				return err
			}
			defer st.Close()
		}
		for round := range 4 {
			n := 8
			if me == 1 {
				n = 9
			}
			if err := c.AllGather(ctx, make([]byte, 2*n), make([]byte, n)); !errors.Is(err, collective.ErrSizeMismatch) {
				return fmt.Errorf("rank %d round %d: %v, want ErrSizeMismatch", me, round, err)
			}
			if err := checkGather(ctx, c, 100, round); err != nil {
				return err
			}
			if me == 0 {
				k, err := st.NumKeys(ctx)
				if err != nil {
					return err
				}
				counts <- k
			}
		}
		return nil
	})
	close(counts)
	var got []int64
	for k := range counts {
		got = append(got, k)
	}
	if len(got) != 4 || got[1] != got[0]+2 || got[2] != got[1] || got[3] != got[1] {
		t.Errorf("the store's keys after each of 4 mismatches: %v, want two more after the second, then the same", got)
	}
}
