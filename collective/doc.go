// Package collective is slimego's public API: a [Communicator] over the ranks
// of a job, and the AllGather collective on it.
//
// A job is launched by slimerun (or torchrun, Slurm's srun, OpenMPI's
// mpirun); each rank calls [Init], which reads the launcher's environment,
// meets the other ranks through the rendezvous store at MASTER_ADDR and
// MASTER_PORT, and maps the node's shared memory:
//
//	c, err := collective.Init(ctx, collective.Options{})
//	if err != nil { ... }
//	defer c.Close()
//	dst := make([]float32, c.Size()*len(src))
//	err = collective.AllGatherOf(ctx, c, dst, src)
//
// Every operation is collective: all ranks call the same operations in the
// same order. Errors are *[OpError] values that name the operation, the rank
// and the peer; test them with errors.Is against [ErrTimeout],
// [ErrPeerLost], [ErrSizeMismatch], [ErrClosed] and [ErrInvalid]. Every
// wait is bounded by [Options].Timeout and the context's deadline.
//
// For repeated calls on the same buffers, [Communicator.Plan] prepares the
// call once and [Plan.Run] allocates nothing. A [Plan] is one type whatever
// the backend: Plan, PlanV and PlanBlocks plan host memory,
// [Communicator.PlanGPU], PlanGPUV and PlanGPUBlocks device memory of the
// communicator's GPU (on the CUDA backend). Memory from
// [Communicator.Alloc] is symmetric: peers on the node read it in place.
//
// The backend (cpu or cuda, [Options].Backend) is chosen at Init; after it,
// only where memory lives tells them apart. The engine packages underneath
// (intra, inter, nvshmem, cudagraph, kernels) are not part of the API.
//
// Several ranks can live in one process, one goroutine each, by passing
// Rank, WorldSize and a shared store address in [Options].
package collective
