// Package overlap computes C = AllGather(A)·B with the gather and the GEMM
// overlapped: the first linear layer of a tensor- or sequence-parallel
// block, where each of P ranks holds m rows of A (m × k), B (k × n) is
// replicated, and every rank wants the whole (P·m) × n product.
//
// An [Op] cuts the gather into pieces (row ranges of every rank's block);
// each piece is one of the communicator's own planned all-gathers, so the
// Op runs wherever the communicator does: on the CPU or a GPU, within a
// node or across nodes. The GEMM runs on a compute stream, its own rows
// first (they need no communication), then each piece's rows once the
// piece is gathered. The schedule is a pure function of the shape
// ([Pieces], [Tasks]). One executor serves every backend: it is written
// against package device's interfaces (Device, Buffer, Stream, Event,
// GEMM), so that the communicator's device decides where the matrices live
// and what multiplies them (gonum or OpenBLAS on host memory, cuBLAS on a
// GPU's). [NewWith] sets how finely the gather is cut ([Options]); once
// planned, an Op runs as often as needed and allocates nothing per run.
// Every method that waits on peers takes its context; the Op keeps none.
// The ranks' plans are compared once, at New; the communicator's timeout
// bounds the waits for the gather, Options.ComputeTimeout those for the
// GEMMs, and a run that fails returns only once what it enqueued is done.
package overlap
