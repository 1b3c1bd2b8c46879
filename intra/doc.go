// Package intra is the node-local all-gather engine of the CPU backend: the
// ranks of one node share one POSIX shared-memory segment and move data
// through it with an epoch-numbered flag protocol.
//
// # Protocol
//
// Every rank owns, in the segment, a control line (its futex "bell" and
// liveness state), two headers used alternately by epoch parity, a ring of
// chunk slots, and one line per peer in which it acknowledges what it has
// consumed of that peer. A call at epoch e:
//
//  1. writes the rank's header e (operation, size, a hash of the counts and,
//     for messages of up to [InlineBytes], the data itself in the same lines),
//     storing the epoch last with release semantics;
//  2. waits for every peer's header e and checks that sizes and operations
//     agree, so that a mismatch is an error on every rank and moves no data;
//  3. moves the data: inline data straight from the header; larger messages
//     through the owner's ring of chunk slots, pipelined, each slot stamped
//     with a monotonically increasing chunk number and freed by the readers'
//     consumed counters; or, when the source lies in a symmetric buffer
//     ([Group.Alloc]), by reading the owner's memory directly (zero copy),
//     after which the owner waits for every reader's acknowledgement.
//
// No counter or flag is ever reset, so no barrier is needed between calls,
// and a header is rewritten only two epochs later, when every reader has
// provably moved on. Waits spin briefly and then sleep on the waiting rank's
// own futex word, which a publisher rings only when the rank says it sleeps.
// Every wait has a deadline, and while it sleeps a rank checks its peers'
// processes (pidfds) and states, so a dead or failed peer is an error within
// milliseconds and a slow one within the timeout.
//
// This is an engine package, not slimego's API: programs import
// collective, overlap, launcher and rendezvous, which choose the engine at
// Init and whose exported identifiers name no type of this package (a
// test, internal/depcheck, checks that).
package intra
