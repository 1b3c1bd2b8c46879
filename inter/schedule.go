package inter

// RailPeers returns, for global rank r in a layout of nodes × local ranks
// (rank = node·local + local rank), the ranks it exchanges its own block
// with: the same local rank on every other node, starting with the next
// node.
func RailPeers(nodes, local, r int) []int {
	a, i := r/local, r%local
	peers := make([]int, 0, nodes-1)
	for k := 1; k < nodes; k++ {
		peers = append(peers, ((a+k)%nodes)*local+i)
	}
	return peers
}

// NodeOrder is the order in which node a's ranks gather the nodes' blocks
// within the node: its own first (it needs no network), then the others in
// the order RailPeers receives them. Every rank of node a uses the same
// order, which the intra-node operations require.
func NodeOrder(nodes, a int) []int {
	order := make([]int, nodes)
	for k := range order {
		order[k] = (a + k) % nodes
	}
	return order
}

// RingStep is one step of the ring: send one block to the next rank while
// receiving one from the previous.
type RingStep struct{ Send, Recv int }

// Ring returns rank r's neighbours and steps in a ring of p ranks: at step
// s it forwards block r−s and receives block r−s−1 (mod p), so after p−1
// steps it holds every block, each having crossed every link once.
func Ring(p, r int) (next, prev int, steps []RingStep) {
	next, prev = (r+1)%p, (r-1+p)%p
	for s := 0; s < p-1; s++ {
		steps = append(steps, RingStep{Send: ((r-s)%p + p) % p, Recv: ((r-s-1)%p + p) % p})
	}
	return next, prev, steps
}
