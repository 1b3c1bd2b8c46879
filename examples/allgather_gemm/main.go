// Command allgather_gemm is the Go counterpart of DLSlime's
// all_gather_gemm_overlap example: C = AllGather(A)·B with the gather
// overlapped with the GEMM, checked against a reference GEMM of the fully
// gathered A, then timed against gather-then-GEMM.
//
//	slimerun --standalone --nproc-per-node 4 bin/allgather_gemm --m 256 --n 1024 --k 1024
package main

import (
	"context"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"os"

	"github.com/spf13/pflag"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/bytesize"
	"github.com/slimego/slimego/internal/machine"
	"github.com/slimego/slimego/overlap"
)

func main() {
	m := pflag.Int("m", 256, "rows of A on each rank")
	n := pflag.Int("n", 1024, "columns of B and C")
	k := pflag.Int("k", 1024, "columns of A, rows of B")
	dtype := pflag.String("dtype", "float32", "float32 or float64")
	pieces := pflag.Int("pieces", 4, "pieces the gather is cut into")
	minPiece := pflag.String("min-piece", "", "least a gather piece carries per rank across nodes (suffixes K, M; 0: no least; default: overlap.MinPieceBytes), as slimebench overlap's flag")
	iters := pflag.Int("iters", 5, "timed iterations")
	eager := pflag.Bool("eager-mode", false, "launch directly instead of replaying a captured graph (CUDA backend; the CPU backend always runs eagerly)")
	backend := pflag.String("backend", "auto", "cpu, cuda or auto (cuda: cuBLAS, the gather by the communicator's GPU plans)")
	pflag.Parse()
	esz := map[string]int64{"float32": 4, "float64": 8}[*dtype]
	if esz == 0 {
		usage("--dtype %q: want float32 or float64", *dtype)
	}
	for _, f := range []struct {
		name string
		n    int
	}{{"m", *m}, {"n", *n}, {"k", *k}, {"pieces", *pieces}, {"iters", *iters}} {
		if f.n < 1 {
			usage("--%s %d: want a positive count", f.name, f.n)
		}
	}
	piecing := overlap.Options{Pieces: *pieces}
	if *minPiece != "" {
		v, err := bytesize.Parse(*minPiece)
		if err != nil {
			usage("--min-piece %q: %v", *minPiece, err)
		}
		piecing.MinPieceBytes = int(v)
		if v == 0 {
			piecing.MinPieceBytes = -1 // the API's "no least"
		}
	}
	// What a rank allocates, in elements, counted without overflow: A and
	// B (m·k, k·n) twice (host and the Op's), C and the reference (P·m·n)
	// twice, G and the gathered A (P·m·k) twice; the node's ranks share
	// its memory.
	if o, err := collective.LoadEnv(os.Getenv); err == nil {
		mul := func(x ...int) *big.Int {
			r := big.NewInt(1)
			for _, v := range x {
				r.Mul(r, big.NewInt(int64(v)))
			}
			return r
		}
		P := o.WorldSize
		need := new(big.Int).Add(mul(*m, *k), mul(*k, *n))
		need.Add(need, mul(P, *m, *n)).Add(need, mul(P, *m, *k))
		need.Mul(need, big.NewInt(2*esz))
		limit, what := machine.Share(o.LocalWorldSize)
		if need.Cmp(big.NewInt(limit)) > 0 {
			usage("--m %d --n %d --k %d of %s on %d ranks: about %s bytes a rank, more than the %d bytes of %s", *m, *n, *k, *dtype, P, need, limit, what)
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
	switch *dtype {
	case "float32":
		err = run[float32](ctx, c, *m, *n, *k, piecing, *iters, 1e-5)
	case "float64":
		err = run[float64](ctx, c, *m, *n, *k, piecing, *iters, 1e-12)
	}
	if err != nil {
		fail("%v", err)
	}
}

func fill[T overlap.Float](x []T, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 7))
	for i := range x {
		x[i] = T(r.Float64()*2 - 1)
	}
}

func run[T overlap.Float](ctx context.Context, c *collective.Communicator, m, n, k int, opts overlap.Options, iters int, tol float64) error {
	P := c.Size()
	a, b := make([]T, m*k), make([]T, k*n)
	fill(b, 1)
	fill(a, uint64(100+c.Rank()))
	// The operator runs on the communicator's backend: host memory on the
	// CPU, device memory on a GPU.
	o, err := overlap.NewWith[T](ctx, c, m, n, k, opts)
	if err != nil {
		return err
	}
	defer o.Close()
	if err := o.WriteA(a); err != nil {
		return err
	}
	if err := o.WriteB(b); err != nil {
		return err
	}
	where := fmt.Sprintf("%s, %s mode", c.Device(), o.Mode())
	if err := o.Run(ctx); err != nil {
		return err
	}
	got := make([]T, P*m*n)
	if err := o.ReadC(got); err != nil {
		return err
	}
	// Reference: every rank's A regenerated, one GEMM of the whole.
	full := make([]T, P*m*k)
	for r := range P {
		fill(full[r*m*k:(r+1)*m*k], uint64(100+r))
	}
	want := overlap.Multiply(full, b, P*m, n, k)
	var num, den float64
	for i := range want {
		d := float64(got[i]) - float64(want[i])
		num += d * d
		den += float64(want[i]) * float64(want[i])
	}
	rel := math.Sqrt(num / max(den, 1e-300))
	if rel > tol {
		return fmt.Errorf("rank %d: relative Frobenius error %g exceeds %g", c.Rank(), rel, tol)
	}
	t, err := overlap.Measure(ctx, c, o, iters)
	if err != nil {
		return err
	}
	if c.Rank() == 0 {
		fmt.Printf("all_gather_gemm check passed: %d ranks, A %d×%d per rank, B %d×%d, %T on %s, pieces=%d, relative error %.2g\n", P, m, k, k, n, T(0), where, o.Pieces(), rel)
		mark := ""
		if t.Noisy() {
			mark = fmt.Sprintf(" (noise: min(t_comm, t_gemm) is under %.0f%% of t_seq, so a 1%% change in t_seq or t_overlap moves it by more than 0.1)", 100*overlap.NoisyShare)
		}
		fmt.Printf("t_comm %.0f µs  t_gemm %.0f µs  t_seq %.0f µs  t_overlap %.0f µs  efficiency %.2f%s\n",
			t.Comm, t.GEMM, t.Seq, t.Overlap, t.Efficiency(), mark)
	}
	return c.Barrier(ctx)
}

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "allgather_gemm: "+format+"\n", a...)
	os.Exit(1)
}

// usage reports a bad flag and exits 2, as pflag does for one it cannot
// parse.
func usage(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "allgather_gemm: "+format+"\n", a...)
	os.Exit(2)
}
