package intra

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/internal/teststore"
	"github.com/slimego/slimego/rendezvous"
)

// TestNewGPUPeerAbsent: a GPU group whose other rank never arrives fails
// NewGPU with ErrTimeout within its Timeout (not at ctx's later deadline),
// releasing what it made (it must not crash while cleaning up).
func TestNewGPUPeerAbsent(t *testing.T) {
	dev, err := device.OpenGPU(0)
	if err != nil {
		t.Fatal(err)
	}
	errs := teststore.Run(t, 1, 60*time.Second, func(ctx context.Context, st *rendezvous.Client, _ int) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("NewGPU panicked: %v", p)
			}
		}()
		start := time.Now()
		g, err := NewGPU(ctx, GPUConfig{Store: st, Key: "absent", Rank: 0, Size: 2, Dev: dev, Cap: 4096, Timeout: 500 * time.Millisecond})
		if g != nil {
			g.Close(ctx)
		}
		if !errors.Is(err, fault.ErrTimeout) {
			return fmt.Errorf("rank 1 never arrives: want ErrTimeout, got %v", err)
		}
		if took := time.Since(start); took > 10*time.Second {
			return fmt.Errorf("NewGPU gave up after %v, not within its 500ms Timeout", took)
		}
		return nil
	})
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}
