// Package inter carries AllGather across nodes: a TCP transport between
// ranks on different nodes (several connections per peer pair, framed
// messages that name the sender, the call and the size), and the two
// algorithms that use it:
//
//   - the rail-aligned hierarchical all-gather: rank (node a, local i)
//     exchanges its own block with (b, i) on every other node b, then the
//     node runs one intra-node all-gather per node's blocks, in a fixed order
//     that starts with its own, so that gathering node a's blocks overlaps
//     the network phase; inter-node traffic per rank is the minimum (N−1)·S;
//   - a flat ring over all ranks, every step over TCP, for comparison and
//     for layouts where nodes differ in size.
//
// Who sends which block when is a pure function of the layout (schedule.go),
// tested without a network.
//
// This is an engine package, not slimego's API: programs import
// collective, overlap, launcher and rendezvous, which choose the engine at
// Init and whose exported identifiers name no type of this package (a
// test, internal/depcheck, checks that).
package inter
