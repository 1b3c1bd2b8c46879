// Package depcheck holds no code: its tests check the module's shape. One
// checks that every import points down the package table of
// ../shared/ARCHITECTURE.md (encoded once, as data, in the test); the other
// that the user packages (collective, overlap, p2p, launcher, rendezvous) name no
// type of an engine package (intra, inter, kernels, nvshmem, cudagraph) in
// their exported API.
package depcheck
