package collective

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/internal/machine"
)

// layout is where the ranks run, as they told each other at Init.
type layout struct {
	members [][]int // per node, in node-rank order: its global ranks by local rank
	myNode  int     // index of this rank's node in members
	uniform bool    // every node has the same number of ranks, laid out node by node
	// hostRanks counts the job's ranks on this rank's machine, of every
	// node (0 where this rank could not name its machine): nodes that are
	// network namespaces or containers of one machine share its cores.
	hostRanks int
}

// where is one rank's entry of the layout: its node, local rank and local
// size, and the machine it runs on (its kernel's boot id, or "-").
type where struct {
	node, local, size int
	host              string
}

func (w where) String() string { return fmt.Sprintf("%d %d %d %s", w.node, w.local, w.size, w.host) }

// parseWhere decodes a layout entry read from the store, which is not
// trusted: four fields, three of them integers in [0, 2^31), the last a
// machine name (machine.ValidID).
func parseWhere(v []byte) (where, error) {
	f := strings.Fields(string(v))
	if len(f) != 4 {
		return where{}, fmt.Errorf("%d fields", len(f))
	}
	var n [3]int
	for i := range n {
		x, err := strconv.ParseInt(f[i], 10, 32)
		if err != nil || x < 0 {
			return where{}, fmt.Errorf("field %d is %.64q", i+1, f[i])
		}
		n[i] = int(x)
	}
	if !machine.ValidID(f[3]) {
		return where{}, fmt.Errorf("machine %.128q", f[3])
	}
	return where{node: n[0], local: n[1], size: n[2], host: f[3]}, nil
}

// exchangeLayout publishes this rank's node, local rank, local size and
// machine, and the knobs that must agree (checkKnobs; kind is the backend
// Init resolved), through the store and reads everyone's.
func (c *Communicator) exchangeLayout(ctx context.Context, kind device.Kind) (layout, error) {
	o := c.opts
	if err := c.store.Set(ctx, c.key("knobs/"+strconv.Itoa(o.Rank)), []byte(myKnobs(o, kind).String())); err != nil {
		return layout{}, c.storeFault("init", err, -1, "publishing the knobs")
	}
	me := where{node: o.NodeRank, local: o.LocalRank, size: o.LocalWorldSize, host: machine.ID()}
	if err := c.store.Set(ctx, c.key("layout/"+strconv.Itoa(o.Rank)), []byte(me.String())); err != nil {
		return layout{}, c.storeFault("init", err, -1, "publishing the layout")
	}
	if o.Rank != 0 {
		if err := c.sameWorld(ctx); err != nil {
			return layout{}, err
		}
	}
	all := make([]where, o.WorldSize)
	knobs := make([]knobs, o.WorldSize)
	for r := range all {
		v, err := c.store.Get(ctx, c.key("layout/"+strconv.Itoa(r)))
		if err != nil {
			return layout{}, c.storeFault("init", err, r, fmt.Sprintf("waiting for rank %d to join", r))
		}
		if all[r], err = parseWhere(v); err != nil {
			return layout{}, fault.New("init", o.Rank, r, ErrInvalid, "rank %d published the layout %.128q: %v", r, v, err)
		}
		if r == o.Rank && all[r] != me {
			// Another client rewrote it: the layout built from the
			// store would not be this rank's (its node's ranks and its
			// own place there are what its Options say).
			return layout{}, fault.New("init", o.Rank, -1, ErrInvalid, "this rank's layout entry in the store is %.128q, not the %q it published", v, me.String())
		}
		// Set before the layout: there already.
		if v, err = c.store.Get(ctx, c.key("knobs/"+strconv.Itoa(r))); err != nil {
			return layout{}, c.storeFault("init", err, r, fmt.Sprintf("waiting for rank %d to join", r))
		}
		if knobs[r], err = parseKnobs(v); err != nil {
			return layout{}, fault.New("init", o.Rank, r, ErrInvalid, "rank %d published the knobs %.128q: %v", r, v, err)
		}
	}
	// Everyone has read everyone's before anyone acts on it: rank 0 may
	// host the store and must not leave (on a layout error) while others
	// still read.
	if err := c.store.Barrier(ctx, c.key("layout-read"), o.Rank, o.WorldSize); err != nil {
		return layout{}, c.storeFault("init", err, -1, "waiting for the others to read the layout")
	}
	lay, err := buildLayout(o.Rank, func(r int) (int, int, int) { return all[r].node, all[r].local, all[r].size }, len(all))
	if err != nil {
		return layout{}, err
	}
	if err := checkKnobs(o.Rank, lay, knobs); err != nil {
		return layout{}, err
	}
	lay.hostRanks = sameHost(all, o.Rank)
	return lay, nil
}

// sameWorld compares this rank's WORLD_SIZE with rank 0's before it waits
// for the others: a rank that counts another world waits for other ranks
// than its peers do (one that is never launched, or past a barrier that
// others leave without it), and everyone would wait out the timeout. On
// a difference it aborts this Init's keys in the store, so that the ranks
// waiting there fail at once with the same words (storeFault), and fails
// with ErrInvalid.
func (c *Communicator) sameWorld(ctx context.Context) error {
	o := c.opts
	v, err := c.store.Get(ctx, c.key("knobs/0"))
	if err != nil {
		return c.storeFault("init", err, 0, "waiting for rank 0 to join")
	}
	k0, err := parseKnobs(v)
	if err != nil {
		return fault.New("init", o.Rank, 0, ErrInvalid, "rank 0 published the knobs %q: %v", v, err)
	}
	if mine := strconv.Itoa(o.WorldSize); k0[knobWorldSize] != mine {
		why := fmt.Sprintf("%s differs: rank 0 has %s, rank %d has %s", knobNames[knobWorldSize], k0[knobWorldSize], o.Rank, mine)
		// Best effort: where the abort fails, the others still meet
		// their timeouts.
		_ = c.store.Abort(ctx, c.key(""), o.Rank, abortInvalid+why)
		return fault.New("init", o.Rank, 0, ErrInvalid, "%s", why)
	}
	return nil
}

// sameHost counts the ranks in all that run on rank me's machine (me
// among them), or returns 0 where me could not name its machine.
func sameHost(all []where, me int) int {
	if all[me].host == "-" {
		return 0
	}
	n := 0
	for _, w := range all {
		if w.host == all[me].host {
			n++
		}
	}
	return n
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
				hint := ""
				if nodeFromRank(at, P) {
					hint = " (under mpirun, whose ranks name no node, a node's ranks must come one after another: its default mapping by slot, not --map-by node)"
				}
				return layout{}, fault.New("init", me, r, ErrInvalid,
					"node %d has %d ranks, but rank %d says it is local rank %d of %d%s", n, len(ranks), r, local, size, hint)
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

// nodeFromRank reports whether every rank's node is its rank less its
// local rank: the node label LoadEnv derives under mpirun, which names no
// node.
func nodeFromRank(at func(r int) (node, local, size int), P int) bool {
	for r := range P {
		if node, local, _ := at(r); node != r-local {
			return false
		}
	}
	return true
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
