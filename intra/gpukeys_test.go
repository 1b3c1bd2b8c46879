package intra

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/teststore"
	"github.com/slimego/slimego/rendezvous"
)

// TestGPUAllocFreeKeepsStoreBounded: a long AllocSymmetric/Free loop of a
// GPU group, then Close, leaves the store's key count where it was before
// the group: each allocation's records and barrier keys are deleted once
// every rank is past them, and a store whose limit is far below the keys
// the loop would otherwise leave serves it all. It runs where the CUDA
// library loads (a GPU, or SLIME_CUDA_LIB naming the emulator).
func TestGPUAllocFreeKeepsStoreBounded(t *testing.T) {
	if err := device.CUDAAvailable(); err != nil {
		t.Skipf("skipped: no CUDA library (%v); set SLIME_CUDA_LIB to kernels/build/libslimecuda-emu.so to run it without a GPU", err)
	}
	const (
		L       = 2
		maxKeys = 200
		iters   = 300 // 3 keys per rank each: 1800 without the deletes
	)
	addr := teststore.Serve(t, rendezvous.ServerConfig{MaxKeys: maxKeys})
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	errs := teststore.Ranks(ctx, addr, L, func(ctx context.Context, st *rendezvous.Client, r int) error {
		dev, err := device.OpenGPU(0)
		if err != nil {
			return err
		}
		g, err := NewGPU(ctx, GPUConfig{Store: st, Key: "t", Rank: r, Size: L, Dev: dev, Cap: 1 << 12, Timeout: 20 * time.Second})
		if err != nil {
			return err
		}
		for i := range iters {
			s, err := g.AllocSymmetric(ctx, 64)
			if err != nil {
				g.Close(ctx)
				return fmt.Errorf("alloc %d: %w", i, err)
			}
			if err := s.Free(ctx); err != nil {
				g.Close(ctx)
				return fmt.Errorf("free %d: %w", i, err)
			}
		}
		return g.Close(ctx)
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	st, err := rendezvous.Dial(ctx, addr, rendezvous.Auth{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if n, err := st.NumKeys(ctx); err != nil || n != 0 {
		t.Errorf("the store holds %d keys after the group closed (%v), want 0", n, err)
	}
}
