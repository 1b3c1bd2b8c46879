package inter

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"
)

// Tests that kill survivors of `make mutate MUTATE=inter`
// (docs/MUTATION.md).

// TestHierAloneRides: a hierarchical all-gather of one node of one rank
// (no transport peer) puts the rank's own block in place out of place,
// also where blocks would ride with a send (SendCopyMin 1): with no send,
// nothing rides and the node's own copy is made.
func TestHierAloneRides(t *testing.T) {
	for _, sendCopyMin := range []int{0, 1} {
		for _, n := range []int{5, 70_001} {
			t.Run(fmt.Sprintf("sendcopymin%d/n%d", sendCopyMin, n), func(t *testing.T) {
				errs := clusterWith(t, 1, 1, false, sendCopyMin, func(rank int, ag allGatherer) error {
					for it := range 2 {
						src := make([]byte, n)
						fillBlock(src, rank, it)
						dst := make([]byte, n)
						fillBlock(dst, 999, it) // stale bytes
						if err := ag.run(context.Background(), "allgather", dst, src, []int{n}, []int{0}); err != nil {
							return fmt.Errorf("call %d: %w", it, err)
						}
						if !bytes.Equal(dst, src) {
							return fmt.Errorf("call %d: the own block is not in place", it)
						}
					}
					return ag.barrier(context.Background())
				})
				for r, err := range errs {
					if err != nil {
						t.Errorf("rank %d: %v", r, err)
					}
				}
			})
		}
	}
}

// TestConfigPollMax: a Config that leaves PollMax zero polls for up to
// DefaultPollMax, a set PollMax is kept, and a negative one never polls;
// every connection's reader gets it, and a message then crosses.
func TestConfigPollMax(t *testing.T) {
	for _, c := range []struct{ in, want time.Duration }{{0, DefaultPollMax}, {3 * time.Microsecond, 3 * time.Microsecond}, {-1, 0}} {
		t.Run(fmt.Sprint(c.in), func(t *testing.T) {
			ts := pairWith(t, Config{PollMax: c.in})
			for r, tr := range ts {
				if tr.cfg.PollMax != c.want {
					t.Errorf("rank %d: PollMax %v, want %v", r, tr.cfg.PollMax, c.want)
				}
				for i, cn := range tr.peers[1-r].conns {
					if cn.rd.PollMax != c.want {
						t.Errorf("rank %d: connection %d polls for up to %v, want %v", r, i, cn.rd.PollMax, c.want)
					}
				}
			}
			exchange(t, ts, 3*StripeMin+1, 1)
		})
	}
}
