// Package overlap computes C = AllGather(A)·B with the gather and the GEMM
// overlapped: the first linear layer of a tensor- or sequence-parallel
// block, where each of P ranks holds m rows of A (m × k), B (k × n) is
// replicated, and every rank wants the whole (P·m) × n product.
//
// An [Op] cuts the gather into pieces (row ranges of every rank's block)
// that run on a communication stream, each followed by an event; the GEMM
// runs on a compute stream, its own rows first (they need no
// communication), then each piece's rows once the piece's event is reached.
// The schedule is a pure function of the shape ([Pieces], [Tasks]). The
// streams are device.Streams, so the same schedule runs on the CPU now and
// on CUDA streams later. GEMMs are gonum's (blas32, blas64). [NewWith]
// sets how finely the gather is cut ([Options]); once planned, an Op runs
// as often as needed and allocates nothing per run.
package overlap
