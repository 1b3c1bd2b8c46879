package overlap

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/testranks"
)

// TestGPUOverlapLazyGEMM: two in-process ranks share the emulated GPU
// (graph mode, lazy module loading), and rank 1 comes late to its first
// Run, so that rank 0's all-gather kernel already spins waiting for it.
// The emulator treats every GEMM call of its own type, shape and operand
// alignment as a kernel of its own, loaded at its first use and waiting
// for the whole device: a GEMM of a run that New did not warm (rank 1's
// own rows, or a piece's rows at their offset in G and C) would stall both
// ranks until the kernel's timeout. It runs in a child process: a fresh
// library, nothing loaded by an earlier test.
func TestGPUOverlapLazyGEMM(t *testing.T) {
	if err := device.CUDAAvailable(); err != nil {
		t.Fatalf("no CUDA library: %v", err)
	}
	if os.Getenv("SLIME_OVERLAP_LAZY_CHILD") == "" {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), "SLIME_OVERLAP_LAZY_CHILD=1", "CUDA_MODULE_LOADING=LAZY")
		out, err := cmd.CombinedOutput()
		if len(out) > 4000 {
			out = append(out[:4000:4000], "\n[...]"...)
		}
		if err != nil || !bytes.Contains(out, []byte("--- PASS: "+t.Name())) {
			t.Fatalf("the child process failed (%v):\n%s", err, out)
		}
		return
	}
	const P, m, n, k, pieces = 2, 37, 19, 53, 3 // k = 53: rows of G only 4-byte aligned
	testranks.Run(t, 1, P, func(o *collective.Options) {
		o.Backend, o.Eager, o.Timeout, o.GPUScratch = device.CUDA, false, 5*time.Second, 64<<10
	}, func(c *collective.Communicator) error {
		ctx := context.Background()
		o, err := NewWith[float32](ctx, c, m, n, k, Options{Pieces: pieces, MinPieceBytes: -1})
		if err != nil {
			return err
		}
		defer o.Close()
		if o.Mode() != "graph" {
			return fmt.Errorf("%s mode, want graph", o.Mode())
		}
		a, b, cHost := make([]float32, m*k), make([]float32, k*n), make([]float32, P*m*n)
		fillRand(b, 99)
		fillRand(a, uint64(c.Rank()*1000))
		if err := o.WriteB(b); err != nil {
			return err
		}
		if err := o.WriteA(a); err != nil {
			return err
		}
		if c.Rank() == 1 {
			time.Sleep(300 * time.Millisecond)
		}
		start := time.Now()
		if err := o.Run(ctx); err != nil {
			return fmt.Errorf("first run: %w (after %v)", err, time.Since(start).Round(time.Millisecond))
		}
		if err := o.ReadC(cHost); err != nil {
			return err
		}
		if e := relErr(cHost, reference(P, m, n, k, b, 0)); e > 1e-5 {
			return fmt.Errorf("relative error %.3g", e)
		}
		return nil
	})
}
