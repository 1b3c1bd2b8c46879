// Package p2p is a point-to-point transfer engine: an Endpoint per
// process registers memory (host slices, symmetric host buffers, GPU
// buffers) as Regions with random 64-bit keys, links to peers through the
// rendezvous store (Publish, Connect) or out of band (Info, ConnectInfo),
// and moves bytes with batched one-sided Read and Write, WriteWithImm
// (whose immediate the target takes with Imm after the bytes), and
// two-sided Send and Recv matched in order. Every call returns a Future
// whose Wait takes a context: cancelling it stops the transfer, and once
// Wait has returned nothing of the transfer touches this side's memory.
//
// Transports are chosen per peer at Connect and reported per transfer
// (Future.Transport): striped, authenticated TCP across hosts (several
// connections, inter's Reader and Stripes), and on the same host one copy
// with process_vm_readv/writev of ranges the target checked and granted.
// GPU memory goes device to device through CUDA IPC handles of the
// target's allocations between processes on one host, and is staged
// through host memory over TCP elsewhere. The target checks
// every request (region, key, bounds) before it touches memory; a refused
// request fails on both sides and moves nothing. Every wait is bounded: a
// dead peer fails its transfers when its sockets close or its pidfd
// fires, a silent link within the heartbeat deadline.
//
// docs/P2P.md describes the wire protocol and the safety rules.
package p2p
