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
// call once and [Plan.Run] allocates nothing (across nodes, given the same
// context each time, or one that cannot be cancelled). A [Plan] is one
// type whatever the backend: Plan, PlanV and PlanBlocks plan host byte
// slices on either backend; [Communicator.PlanBuffers], PlanBuffersV and PlanBuffersBlocks
// plan the backend's own memory, device.Buffer values from
// [Communicator.Device] (host buffers on the CPU, device memory on CUDA),
// ordered on [Communicator.Stream] alike on both backends, so that code
// written once orders its own work after a gather with an event on that
// stream and ends with [Communicator.Synchronize]. Memory from
// [Communicator.Alloc] is symmetric: peers on the node read it in place.
//
// The backend (cpu or cuda, [Options].Backend) is chosen at Init, and with
// it the one engine that gathers the backend's memory (on CUDA: the node's
// LL kernel, NVSHMEM across nodes, the job's algorithm across nodes over
// host-staged TCP, or host staging where the node's GPUs cannot reach
// each other); after it, only where memory lives tells the backends
// apart. The engine packages underneath (intra, inter, nvshmem,
// cudagraph, kernels) are not part of the API.
//
// Several ranks can live in one process, one goroutine each, by passing
// Rank, WorldSize and a shared store address in [Options].
package collective
