package collective_test

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
)

// TestPrecancelledContext: a call given a context that is already
// cancelled fails on every rank, whoever arrives last: on the rank that
// passed it with context.Canceled, on the others naming that rank. Within
// a node such a rank, coming after its peers had published their blocks,
// found nothing to wait for and returned nil (and moved the data) without
// looking at its context; the ranks' outcomes then depended on timing.
func TestPrecancelledContext(t *testing.T) {
	for _, tc := range []struct{ P, who int }{{1, 0}, {3, 1}, {3, 0}} {
		t.Run(fmt.Sprintf("P=%d,rank=%d", tc.P, tc.who), func(t *testing.T) {
			var others []int
			for r := range tc.P {
				if r != tc.who {
					others = append(others, r)
				}
			}
			j := expectFault(t, []string{"SLIME_TIMEOUT=20"}, tc.P, others, "--fault", "precancel",
				"--fault-rank", fmt.Sprint(tc.who), "--fault-size", "4096")
			if !regexp.MustCompile(fmt.Sprintf(`(?m)^\[%d\]: EXPECTED rank %d: allgather rank %d: context canceled`, tc.who, tc.who, tc.who)).MatchString(j.out) {
				t.Errorf("rank %d did not fail its call with context.Canceled:\n%s\n%s", tc.who, j.out, j.stderr)
			}
			for _, r := range others {
				if !strings.Contains(j.out, fmt.Sprintf("[%d]: EXPECTED rank %d: allgather rank %d peer %d: slimego: peer lost", r, r, r, tc.who)) {
					t.Errorf("rank %d did not name rank %d", r, tc.who)
				}
			}
		})
	}
}

// TestPrecancelledContextAcrossNodes: the same across nodes (one rank
// per node, and two), where the transport's watch fails the call.
func TestPrecancelledContextAcrossNodes(t *testing.T) {
	for _, perNode := range []int{1, 2} {
		t.Run(fmt.Sprintf("2x%d", perNode), func(t *testing.T) {
			j := runNodes(t, []string{"SLIME_TIMEOUT=20"}, 2, perNode, nil, "agcheck", "--fault", "precancel", "--fault-rank", "1", "--fault-size", "4096")
			all := strings.Join(j.out, "")
			if strings.Contains(all, "UNEXPECTED") || strings.Count(all, "EXPECTED rank") != 2*perNode {
				t.Errorf("want every rank to report the expected failure:\n%s", all)
			}
			if !strings.Contains(all, "EXPECTED rank 1: allgather rank 1") || !strings.Contains(all, "context canceled") {
				t.Errorf("rank 1 did not fail with context.Canceled:\n%s", all)
			}
		})
	}
}

// TestPrecancelledContextGPU: on the CUDA backend (here the emulated
// library TestMain points SLIME_CUDA_LIB at) a plan of GPU memory run
// with a cancelled context fails with context.Canceled, as Synchronize
// documents for both backends (the wait for the GPU gave up with
// ErrTimeout, "the GPU's work was not done after 0s"), and launches
// nothing: the peer's run fails at its kernels' timeout naming rank 1
// (rank 1's kernels completed the peer's call, and its own wait
// returned nil where it found them done).
func TestPrecancelledContextGPU(t *testing.T) {
	needGPU(t)
	j := slimerun(t, []string{"SLIME_BACKEND=cuda", "SLIME_TIMEOUT=5"}, "--monitor-interval", "15s", "--nproc-per-node", "2",
		"agcheck", "--fault", "cancel-gpu", "--fault-rank", "1", "--fault-size", "4096")
	if !regexp.MustCompile(`(?m)^\[1\]: EXPECTED rank 1: allgather rank 1: context canceled`).MatchString(j.out) ||
		!regexp.MustCompile(`(?m)^\[0\]: EXPECTED rank 0: allgather rank 0 peer 1: .*timeout`).MatchString(j.out) || strings.Contains(j.out, "UNEXPECTED") {
		t.Errorf("exit %d; want rank 1's run to fail with context.Canceled, and rank 0's naming rank 1:\n%s\n%s", j.code, j.out, j.stderr)
	}
}

// TestCancelledWaitEndsEveryRank: a rank whose context is cancelled
// while it waits for its peers ends the call on every rank, as DESIGN
// says and as across nodes: the peers that come later name it. Within a
// node a small block sat in the header (inline) and a staged one in the
// ring, and the peers that came after the cancel read them and returned
// nil, only their next call meeting the break.
func TestCancelledWaitEndsEveryRank(t *testing.T) {
	for _, tc := range []struct {
		P    int
		size string
		env  []string
	}{{2, "64", nil}, {3, "4096", nil}, {3, "1M", []string{"SLIME_CMA_MIN=-1"}}, {3, "1M", nil}} {
		t.Run(fmt.Sprintf("P=%d,%s,%v", tc.P, tc.size, tc.env), func(t *testing.T) {
			var others []int
			for r := 1; r < tc.P; r++ {
				others = append(others, r)
			}
			j := expectFault(t, append([]string{"SLIME_TIMEOUT=20"}, tc.env...), tc.P, others, "--fault", "cancel-wait", "--fault-rank", "0", "--fault-size", tc.size)
			if !strings.Contains(j.out, "[0]: EXPECTED rank 0: allgather rank 0") {
				t.Errorf("rank 0's cancelled call was not context.Canceled:\n%s\n%s", j.out, j.stderr)
			}
		})
	}
}

// TestCancelledWaitNamesNoPeer: the rank whose context was cancelled
// while it waited gave up itself: its error (context.Canceled) names no
// peer, as across nodes (inter's failDrained), not the peer it happened
// to wait for, which is not at fault (a framework that reads
// OpError.Peer blamed that rank).
func TestCancelledWaitNamesNoPeer(t *testing.T) {
	j := expectFault(t, []string{"SLIME_TIMEOUT=20"}, 3, []int{1, 2}, "--fault", "cancel-wait", "--fault-rank", "0", "--fault-size", "4096")
	if !regexp.MustCompile(`(?m)^\[0\]: EXPECTED rank 0: allgather rank 0: context canceled`).MatchString(j.out) {
		t.Errorf("rank 0's cancelled call named a peer:\n%s\n%s", j.out, j.stderr)
	}
}
