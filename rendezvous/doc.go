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
// The server bounds what any client, even one that passed the handshake,
// can make it hold ([ServerConfig]): the size of a value (1 MiB by default)
// and of a key ([MaxKeyBytes]), the keys and bytes stored (64 Ki keys,
// 64 MiB), the key bytes that blocked requests hold while they wait (as
// many as the bytes stored: beyond them a wait is refused), the
// connections served at once (16384), and the time a begun frame may take
// to arrive (10 s). A frame larger than the value limit allows is refused
// before anything is allocated for it, and one large frame does not pin
// its memory for the connection's life, nor while its request waits. A
// wait whose client hangs up ends at once, freeing its connection.
//
// The wire format is versioned and length-prefixed; see wire.go.
package rendezvous
