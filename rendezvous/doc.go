// Package rendezvous is a TCP key-value store through which the ranks of a job
// find each other, in the manner of torch's TCPStore.
//
// One process hosts a [Server] (the launcher on node 0, or rank 0 when no
// launcher hosts one); every rank holds a [Client]. The store offers Set, Get
// (which blocks until the key exists), Add (an atomic counter), CompareAndSet,
// Wait for several keys, Delete and Check. Every blocking call honours its
// context's deadline, and the server bounds each wait by the timeout the
// client sends, so no call can block forever.
//
// Abort ([Server.Abort], [Client.Abort]) fails every wait on keys under a
// prefix at once: a launcher that sees a worker exit aborts the attempt's
// prefix ([AttemptPrefix]), and every rank still blocked in the store gets
// an [*AbortError] naming the rank and the reason, instead of waiting out
// its timeout. Keys that exist still read.
//
// The wire format is versioned and length-prefixed; see wire.go.
package rendezvous
