package intra

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/internal/teststore"
	"github.com/slimego/slimego/rendezvous"
)

// TestNewRanksLength: a Config whose global ranks do not list one per
// local rank (a layout a caller built from a store that was rewritten) is
// ErrInvalid, for New and NewGPU alike; the group indexed past the list's
// end (a panic) where it named its rank or a peer.
func TestNewRanksLength(t *testing.T) {
	errs := teststore.Run(t, 1, 20*time.Second, func(ctx context.Context, st *rendezvous.Client, _ int) error {
		for _, ranks := range [][]int{{1}, {}, {0, 1, 2}} {
			short, cancel := context.WithTimeout(ctx, 2*time.Second)
			g, err := New(short, Config{Store: st, Key: fmt.Sprintf("ranks%d", len(ranks)), ShmPrefix: fmt.Sprintf("slimego-test-%d-", os.Getpid()), Rank: 1, Size: 2, Ranks: ranks})
			cancel()
			if !errors.Is(err, fault.ErrInvalid) {
				if g != nil {
					g.Close()
				}
				return fmt.Errorf("New with ranks %v for 2: want ErrInvalid, got %v", ranks, err)
			}
			if device.CUDAAvailable() != nil {
				continue
			}
			dev, err := device.OpenGPU(0)
			if err != nil {
				return err
			}
			short, cancel = context.WithTimeout(ctx, 2*time.Second)
			gg, err := NewGPU(short, GPUConfig{Store: st, Key: fmt.Sprintf("gpuranks%d", len(ranks)), Rank: 1, Size: 2, Ranks: ranks, Dev: dev})
			cancel()
			if !errors.Is(err, fault.ErrInvalid) {
				if gg != nil {
					gg.Close(ctx)
				}
				return fmt.Errorf("NewGPU with ranks %v for 2: want ErrInvalid, got %v", ranks, err)
			}
		}
		return nil
	})
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
}
