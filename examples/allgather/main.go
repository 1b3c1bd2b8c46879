// Command allgather is the Go counterpart of DLSlime's all_gather_ll
// example: every rank contributes a float32 tensor, gathers everyone's, and
// checks the result element by element.
//
//	slimerun --nproc-per-node 4 --standalone go run ./examples/allgather --mode intra
package main

import (
	"context"
	"fmt"
	"math/big"
	"os"
	"sort"
	"time"
	"unsafe"

	"github.com/spf13/pflag"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/machine"
	"github.com/slimego/slimego/internal/pattern"
)

func main() {
	mode := pflag.String("mode", "intra", "intra (one node) or inter (across nodes)")
	eager := pflag.Bool("eager-mode", false, "launch directly instead of replaying a captured graph (CUDA backend; the CPU backend always runs eagerly)")
	backend := pflag.String("backend", "auto", "cpu, cuda or auto (cuda where a GPU and libslimecuda.so are present)")
	rows := pflag.Int("m", 1024, "rows of each rank's tensor")
	cols := pflag.Int("n", 256, "columns of each rank's tensor")
	iters := pflag.Int("iters", 100, "timed iterations")
	pflag.Parse()
	if *mode != "intra" && *mode != "inter" {
		usage("--mode %q: want intra or inter", *mode)
	}
	for _, f := range []struct {
		name string
		n    int
	}{{"m", *rows}, {"n", *cols}, {"iters", *iters}} {
		if f.n < 1 {
			usage("--%s %d: want a positive count", f.name, f.n)
		}
	}
	// A rank holds everyone's tensors twice (dst, and the device buffer
	// it is gathered in: host memory on the CPU) and its own four times
	// (src, its device buffer, the reference and the bytes it is made
	// from): (2P+4)·m·n float32s, counted without overflow; the node's
	// ranks share its memory.
	if o, err := collective.LoadEnv(os.Getenv); err == nil {
		need := new(big.Int).Mul(big.NewInt(int64(2*o.WorldSize+4)), big.NewInt(4))
		need.Mul(need, big.NewInt(int64(*rows)))
		need.Mul(need, big.NewInt(int64(*cols)))
		limit, what := machine.Share(o.LocalWorldSize)
		if need.Cmp(big.NewInt(limit)) > 0 {
			usage("--m %d --n %d on %d ranks: %s bytes a rank, more than the %d bytes of %s", *rows, *cols, o.WorldSize, need, limit, what)
		}
	}
	kind, err := device.Parse(*backend)
	if err != nil {
		fail("%v", err)
	}
	ctx := context.Background()
	c, err := collective.Init(ctx, collective.Options{Backend: kind, CUDA: collective.CUDA{Eager: *eager}})
	if err != nil {
		fail("%v", err)
	}
	defer c.Close()
	if *mode == "intra" && c.Nodes() > 1 {
		fail("--mode intra with %d nodes", c.Nodes())
	}
	if *mode == "inter" && c.Nodes() == 1 {
		fail("--mode inter needs ranks on more than one node (slimerun --nnodes)")
	}

	P, me, n := c.Size(), c.Rank(), *rows**cols
	src := make([]float32, n)
	dst := make([]float32, P*n)
	want := make([]float32, n)
	fillTensor := func(t []float32, rank, iter int) {
		b := make([]byte, 4*len(t))
		pattern.Fill(b, pattern.Seed(rank, iter, 0))
		for i := range t {
			// Finite values in [-1, 1): every bit pattern survives.
			t[i] = float32(int32(uint32(b[4*i])|uint32(b[4*i+1])<<8|uint32(b[4*i+2])<<16|uint32(b[4*i+3])<<24)) / (1 << 31)
		}
	}
	// The tensors are copied into buffers of the communicator's device
	// (host memory on the CPU, device memory on a GPU), gathered there, and
	// copied back to check.
	run, push, pull, how := planFor(ctx, c, dst, src)
	// Check: three iterations with fresh data.
	for it := range 3 {
		fillTensor(src, me, it)
		if err := push(); err != nil {
			fail("%v", err)
		}
		if err := run(ctx); err != nil {
			fail("%v", err)
		}
		if err := pull(); err != nil {
			fail("%v", err)
		}
		for r := range P {
			fillTensor(want, r, it)
			for i, w := range want {
				if dst[r*n+i] != w {
					fail("rank %d: element %d of rank %d's block is %v, want %v", me, i, r, dst[r*n+i], w)
				}
			}
		}
	}
	// Time it.
	times := make([]time.Duration, *iters)
	for i := range times {
		t0 := time.Now()
		if err := run(ctx); err != nil {
			fail("%v", err)
		}
		times[i] = time.Since(t0)
	}
	sort.Slice(times, func(a, b int) bool { return times[a] < times[b] })
	med := times[len(times)/2]
	if err := c.Barrier(ctx); err != nil {
		fail("%v", err)
	}
	bytes := float64(4 * P * n)
	fmt.Printf("rank %d: all_gather check passed: %d ranks × [%d, %d] float32, mode %s, %s; median %.1f µs, %.2f GB/s\n",
		me, P, *rows, *cols, *mode, how, float64(med.Nanoseconds())/1e3, bytes/float64(med.Nanoseconds()))
}

// planFor plans the all-gather of src into dst on the communicator's
// device, whichever backend it is: run performs one, push and pull copy
// the tensors to and from the device's buffers, how says where it runs.
func planFor(ctx context.Context, c *collective.Communicator, dst, src []float32) (run func(context.Context) error, push, pull func() error, how string) {
	d := c.Device()
	bsrc, err := d.NewBuffer(4 * len(src))
	if err != nil {
		fail("%v", err)
	}
	bdst, err := d.NewBuffer(4 * len(dst))
	if err != nil {
		fail("%v", err)
	}
	plan, err := c.PlanBuffers(ctx, bdst, bsrc)
	if err != nil {
		fail("%v", err)
	}
	push = func() error { return bsrc.CopyIn(f32bytes(src)) }
	pull = func() error { return bdst.CopyOut(f32bytes(dst)) }
	return plan.Run, push, pull, "backend " + plan.String()
}

func f32bytes(s []float32) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), 4*len(s))
}

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "allgather: "+format+"\n", a...)
	os.Exit(1)
}

// usage reports a bad flag and exits 2, as pflag does for one it cannot
// parse.
func usage(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "allgather: "+format+"\n", a...)
	os.Exit(2)
}
