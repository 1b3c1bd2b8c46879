// Package nvshmem joins the ranks of a job into one NVSHMEM job, for GPU
// all-gathers across nodes: rank 0 makes the bootstrap unique id, the
// rendezvous store hands it to every rank, and each rank initializes
// NVSHMEM with it (no MPI, no NVSHMEM launcher). The symmetric heap then
// holds the staging slots of the put-with-signal all-gather kernel of
// kernels/nvshmem.cu.
//
// It needs libslimenvshmem.so (make kernels NVSHMEM_HOME=...); where it is
// absent [Bootstrap] reports kernels.ErrNotFound and the communicator moves
// GPU data across nodes through host memory and the TCP transport instead.
//
// This is an engine package, not slimego's API: programs import
// collective, overlap, launcher and rendezvous, which choose the engine at
// Init and whose exported identifiers name no type of this package (a
// test, internal/depcheck, checks that).
package nvshmem

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/kernels"
	"github.com/slimego/slimego/rendezvous"
)

// Team is this rank's membership in the NVSHMEM job.
type Team struct {
	lib         *kernels.NVSHMEM
	dev         *device.GPU
	store       *rendezvous.Client
	key         string
	rank, size  int
	timeout     time.Duration
	initialized bool
	planned     int
}

// Bootstrap initializes NVSHMEM for rank of size on dev, passing rank 0's
// unique id through st under key. Every rank of the job calls it.
func Bootstrap(ctx context.Context, st *rendezvous.Client, key string, dev *device.GPU, rank, size int, timeout time.Duration) (*Team, error) {
	lib, err := kernels.OpenNVSHMEM()
	if err != nil {
		return nil, err
	}
	t := &Team{lib: lib, dev: dev, store: st, key: key, rank: rank, size: size, timeout: timeout}
	var uid []byte
	if rank == 0 {
		if uid, err = lib.UniqueID(); err != nil {
			st.Set(ctx, key+"/uid", []byte("error: "+err.Error()))
			return nil, fault.New("init", rank, -1, err, "NVSHMEM unique id")
		}
		if err := st.Set(ctx, key+"/uid", uid); err != nil {
			return nil, fault.New("init", rank, -1, err, "publishing the NVSHMEM unique id")
		}
	} else {
		if uid, err = st.Get(ctx, key+"/uid"); err != nil {
			return nil, fault.New("init", rank, 0, fault.ErrTimeout, "waiting for rank 0's NVSHMEM unique id: %v", err)
		}
		if msg, ok := strings.CutPrefix(string(uid), "error: "); ok {
			return nil, fault.New("init", rank, 0, fault.ErrPeerLost, "rank 0 could not make the NVSHMEM unique id: %s", msg)
		}
	}
	if err := lib.Init(dev.Ordinal, uid, rank, size); err != nil {
		return nil, fault.New("init", rank, -1, err, "NVSHMEM init")
	}
	t.initialized = true
	return t, nil
}

// Close leaves the NVSHMEM job.
func (t *Team) Close() error {
	if !t.initialized {
		return nil
	}
	t.initialized = false
	return t.lib.Finalize()
}

// AllGather is a planned put-with-signal all-gather of equal blocks.
type AllGather struct {
	t       *Team
	args    kernels.NVSHMEMAllGatherArgs
	stage   kernels.Ptr
	sig     kernels.Ptr
	counter kernels.Ptr
	status  unsafe.Pointer
}

// Plan prepares an all-gather of bytes per rank from src into out (size ×
// bytes), both device addresses. Collective: every rank plans the same
// sizes in the same order (the symmetric heap is allocated collectively).
func (t *Team) Plan(ctx context.Context, src, out kernels.Ptr, bytes int) (a *AllGather, err error) {
	lib, dev := t.dev.Lib(), t.dev.Ordinal
	a = &AllGather{t: t}
	defer func() {
		if err != nil {
			a.Close()
		}
	}()
	n := uint64(bytes)
	if a.stage, err = t.lib.Malloc(2 * uint64(t.size) * n); err != nil {
		return nil, fault.New("allgather", t.rank, -1, err, "")
	}
	if a.sig, err = t.lib.Malloc(2 * uint64(t.size) * 8); err != nil {
		return nil, fault.New("allgather", t.rank, -1, err, "")
	}
	if a.counter, err = lib.Malloc(dev, kernels.CounterBytes); err != nil {
		return nil, err
	}
	var statusD kernels.Ptr
	if a.status, statusD, err = lib.HostAlloc(dev, 64); err != nil {
		return nil, err
	}
	for _, z := range []struct {
		p kernels.Ptr
		n uint64
	}{{a.sig, 2 * uint64(t.size) * 8}, {a.counter, kernels.CounterBytes}} {
		if err = lib.Memset(dev, z.p, 0, z.n); err != nil {
			return nil, err
		}
	}
	// No rank puts a signal into a peer's heap before the peer zeroed it.
	a.t.planned++
	if err = t.store.Barrier(ctx, fmt.Sprintf("%s/plan%d", t.key, a.t.planned), t.rank, t.size); err != nil {
		return nil, fault.New("allgather", t.rank, -1, fault.ErrTimeout, "waiting for the ranks to plan the NVSHMEM all-gather: %v", err)
	}
	a.args = kernels.NVSHMEMAllGatherArgs{
		Rank: int32(t.rank), NRanks: int32(t.size), Src: src, Bytes: n, Stage: a.stage, Out: out,
		Sig: a.sig, Epoch: a.counter, Sync: a.counter + 8, Status: statusD, TimeoutNS: uint64(t.timeout.Nanoseconds()),
	}
	return a, nil
}

// Launch enqueues the kernel on s (graph-capturable).
func (a *AllGather) Launch(s *device.CUDAStream) error {
	return a.t.lib.AllGather(a.t.dev.Ordinal, &a.args, s.H)
}

// Check reads the kernel's status word after synchronizing.
func (a *AllGather) Check() error {
	w := atomic.LoadInt32((*int32)(a.status))
	if w == 0 {
		return nil
	}
	err := fault.ErrTimeout
	if w&0xff == kernels.StatusSize {
		err = fault.ErrSizeMismatch
	}
	return fault.New("allgather", a.t.rank, int(w>>8), err, "the NVSHMEM kernel gave up waiting for the peer's block")
}

// Close releases the plan's memory. The heap frees are collective.
func (a *AllGather) Close() error {
	var errs []error
	lib, dev := a.t.dev.Lib(), a.t.dev.Ordinal
	if a.stage != 0 {
		errs = append(errs, a.t.lib.Free(a.stage))
	}
	if a.sig != 0 {
		errs = append(errs, a.t.lib.Free(a.sig))
	}
	if a.counter != 0 {
		errs = append(errs, lib.Free(dev, a.counter))
	}
	if a.status != nil {
		errs = append(errs, lib.HostFree(dev, a.status))
	}
	*a = AllGather{t: a.t}
	return errors.Join(errs...)
}
