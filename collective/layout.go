package collective

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/slimego/slimego/internal/fault"
)

// layout is where the ranks run, as they told each other at Init.
type layout struct {
	members [][]int // per node, in node-rank order: its global ranks by local rank
	myNode  int     // index of this rank's node in members
	uniform bool    // every node has the same number of ranks, laid out node by node
}

// exchangeLayout publishes this rank's node, local rank and local size
// through the store and reads everyone's.
func (c *Communicator) exchangeLayout(ctx context.Context) (layout, error) {
	o := c.opts
	me := fmt.Sprintf("%d %d %d", o.NodeRank, o.LocalRank, o.LocalWorldSize)
	if err := c.store.Set(ctx, c.key("layout/"+strconv.Itoa(o.Rank)), []byte(me)); err != nil {
		return layout{}, c.storeFault("init", err, -1, "publishing the layout")
	}
	type where struct{ node, local, size int }
	all := make([]where, o.WorldSize)
	for r := range all {
		v, err := c.store.Get(ctx, c.key("layout/"+strconv.Itoa(r)))
		if err != nil {
			return layout{}, c.storeFault("init", err, r, fmt.Sprintf("rank %d never joined", r))
		}
		f := strings.Fields(string(v))
		var w where
		var errs [3]error
		if len(f) == 3 {
			w.node, errs[0] = strconv.Atoi(f[0])
			w.local, errs[1] = strconv.Atoi(f[1])
			w.size, errs[2] = strconv.Atoi(f[2])
		}
		if len(f) != 3 || errs[0] != nil || errs[1] != nil || errs[2] != nil {
			return layout{}, fault.New("init", o.Rank, r, ErrInvalid, "rank %d published the layout %q", r, v)
		}
		all[r] = w
	}
	// Everyone has read everyone's before anyone acts on it: rank 0 may
	// host the store and must not leave (on a layout error) while others
	// still read.
	if err := c.store.Barrier(ctx, c.key("layout-read"), o.Rank, o.WorldSize); err != nil {
		return layout{}, c.storeFault("init", err, -1, "waiting for the others to read the layout")
	}
	return buildLayout(o.Rank, func(r int) (int, int, int) { return all[r].node, all[r].local, all[r].size }, len(all))
}

// buildLayout groups ranks by node and checks that each node's local ranks
// are 0..n−1 with n the local size they all report.
func buildLayout(me int, at func(r int) (node, local, size int), P int) (layout, error) {
	byNode := map[int][]int{}
	for r := range P {
		node, _, _ := at(r)
		byNode[node] = append(byNode[node], r)
	}
	nodes := make([]int, 0, len(byNode))
	for n := range byNode {
		nodes = append(nodes, n)
	}
	slices.Sort(nodes)
	var lay layout
	lay.uniform = true
	myNode, _, _ := at(me)
	for i, n := range nodes {
		ranks := byNode[n]
		members := make([]int, len(ranks))
		seen := make([]bool, len(ranks))
		for _, r := range ranks {
			_, local, size := at(r)
			if size != len(ranks) || local < 0 || local >= len(ranks) || seen[local] {
				return layout{}, fault.New("init", me, r, ErrInvalid,
					"node %d has %d ranks, but rank %d says it is local rank %d of %d", n, len(ranks), r, local, size)
			}
			seen[local] = true
			members[local] = r
		}
		lay.members = append(lay.members, members)
		if n == myNode {
			lay.myNode = i
		}
		L := len(lay.members[0])
		for j, r := range members {
			if len(members) != L || r != i*L+j {
				lay.uniform = false
			}
		}
	}
	return lay, nil
}

// chooseAlgo settles the algorithm: "intra" on one node (unless a ring is
// asked for), the hierarchical one where the layout allows it.
func chooseAlgo(o Options, lay layout) (string, error) {
	switch {
	case o.Algo == "ring":
		return "ring", nil
	case len(lay.members) == 1:
		return "intra", nil
	case o.Algo == "hier" && !lay.uniform:
		return "", fault.New("init", o.Rank, -1, ErrInvalid,
			"the hierarchical all-gather needs the same number of ranks on every node, numbered node by node; this job's nodes hold %v ranks (use SLIME_ALGO=ring or auto)", nodeSizes(lay))
	case lay.uniform:
		return "hier", nil
	}
	return "ring", nil
}

func nodeSizes(lay layout) []int {
	s := make([]int, len(lay.members))
	for i, m := range lay.members {
		s[i] = len(m)
	}
	return s
}
