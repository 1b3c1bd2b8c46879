package intra

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/pattern"
	"github.com/slimego/slimego/internal/teststore"
	"github.com/slimego/slimego/rendezvous"
)

// TestGPUPeerDevices: in-process ranks on different GPUs (the emulator has
// two under TestMain) gather correctly: a GPU group enables peer access
// from each rank's device to every in-process peer's other device before
// any kernel touches the peer's memory directly. Ranks on one device and
// on two mix; blocks of two rounds and odd sizes.
func TestGPUPeerDevices(t *testing.T) {
	n, err := device.CUDADeviceCount()
	if err != nil {
		t.Fatal(err)
	}
	if n < 2 {
		t.Skipf("one GPU here: in-process ranks on different GPUs need two (the emulator has %s)", "SLIME_EMU_DEVICES")
	}
	for _, devs := range [][]int{{0, 1}, {0, 1, 0}, {1, 0, 0, 1}} {
		t.Run(fmt.Sprint(devs), func(t *testing.T) {
			gatherOnDevices(t, devs, []int{5003, 1, 4096, 0}[:len(devs)])
		})
	}
}

// gatherOnDevices runs one GPU group of len(devs) in-process ranks, rank r
// on GPU devs[r], and checks two all-gathers of sizes[r] bytes per rank.
func gatherOnDevices(t *testing.T, devs, sizes []int) {
	t.Helper()
	P := len(devs)
	offs := make([]int, P)
	total := 0
	for r, n := range sizes {
		offs[r], total = total, total+n
	}
	errs := teststore.Run(t, P, 60*time.Second, func(ctx context.Context, st *rendezvous.Client, r int) error {
		dev, err := device.OpenGPU(devs[r])
		if err != nil {
			return err
		}
		g, err := NewGPU(ctx, GPUConfig{Store: st, Key: "peer", Rank: r, Size: P, Dev: dev, Cap: 4096, Timeout: 20 * time.Second})
		if err != nil {
			return err
		}
		defer g.Close(ctx)
		dst, err := dev.Alloc(total)
		if err != nil {
			return err
		}
		defer dst.Free()
		src, err := dev.Alloc(max(sizes[r], 1))
		if err != nil {
			return err
		}
		defer src.Free()
		s, err := dev.NewCUDAStream()
		if err != nil {
			return err
		}
		defer s.Close()
		plan, err := g.Plan(dst.Ptr, src.Ptr, sizes, offs)
		if err != nil {
			return err
		}
		host := make([]byte, total)
		for it := range 2 {
			blk := make([]byte, sizes[r])
			pattern.Fill(blk, pattern.Seed(r, it, uint64(sizes[r])))
			if err := src.CopyFromHost(blk); err != nil {
				return err
			}
			if err := plan.Launch(s); err != nil {
				return err
			}
			if err := s.Synchronize(ctx); err != nil {
				return err
			}
			if err := g.Check("allgather"); err != nil {
				return err
			}
			if err := dst.CopyToHost(host); err != nil {
				return err
			}
			for q := range P {
				if i := pattern.Check(host[offs[q]:offs[q]+sizes[q]], pattern.Seed(q, it, uint64(sizes[q]))); i >= 0 {
					return fmt.Errorf("iteration %d: block of rank %d (GPU %d) wrong at byte %d", it, q, devs[q], i)
				}
			}
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d (GPU %d): %v", r, devs[r], err)
		}
	}
}
