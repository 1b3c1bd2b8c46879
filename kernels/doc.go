// Package kernels loads slimego's GPU libraries at run time and calls them.
//
// libslimecuda.so (the CUDA runtime calls, IPC, streams, events, CUDA
// graphs, the intra-node all-gather kernels and cuBLAS GEMM) and, where
// NVSHMEM is installed, libslimenvshmem.so are built by nvcc with `make
// kernels` from the sources beside this file; slime.h is the whole ABI
// between them and Go. Like go-nvml with libnvidia-ml, this package opens
// them with dlopen, so the Go module builds and tests with no CUDA
// installed and one binary runs on machines with and without GPUs: [Open]
// reports [ErrNotFound] or [ErrNoDevice], and the callers fall back to the
// CPU backend or fail clearly.
//
// Every call selects its device itself (goroutines move between threads)
// and returns an *[Error] naming the call and CUDA's message. Nothing here
// blocks without a bound: streams and events are polled by the caller
// (see package device), and the kernels that wait for peers give up after
// their timeout and leave a status word that the host reads.
//
// libslimecuda-emu.so (`make kernels-emu`, or [BuildEmulator]) is the same
// ABI built by the host's g++ with no GPU: device memory in shared host
// memory, streams as host queues, the kernels' protocol (protocol.h, which
// slime.cu compiles too) on host threads, and an adversarial schedule
// (SLIME_EMU_SEED) that is never kinder than CUDA's guarantees. Pointing
// SLIME_CUDA_LIB at it runs the whole GPU path on any Linux host; [Lib.Emulated]
// tells callers so, since nothing measured on it is a GPU figure.
//
// Without cgo, or off Linux, Open always reports ErrNotFound.
//
// This is an engine package, not slimego's API: programs import
// collective, overlap, launcher and rendezvous, which choose the engine at
// Init and whose exported identifiers name no type of this package (a
// test, internal/depcheck, checks that).
package kernels
