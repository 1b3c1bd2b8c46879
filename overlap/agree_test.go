package overlap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/testranks"
)

// opOf is an Op of either element type, for tests whose ranks differ in it.
type opOf interface {
	Run(context.Context) error
	Close() error
}

// plannedShape is what one rank passes to NewWith.
type plannedShape struct {
	m, n, k, pieces int
	f64             bool // float64 elements, not float32
}

// bitsAgainstGather checks o's C, after Run and after RunSequential,
// against a plain all-gather of A followed by one GEMM of the whole
// gathered A, bit for bit, with random A and B.
func bitsAgainstGather[T Float](ctx context.Context, c *collective.Communicator, o *Op[T], m, n, k int) error {
	P := c.Size()
	a, b := make([]T, m*k), make([]T, k*n)
	fillRand(a, uint64(c.Rank()*1000+17))
	fillRand(b, uint64(31+n))
	if err := o.WriteA(a); err != nil {
		return err
	}
	if err := o.WriteB(b); err != nil {
		return err
	}
	g := make([]T, P*m*k)
	if err := collective.AllGatherOf(ctx, c, g, a); err != nil {
		return err
	}
	want := asBytes(Multiply(g, b, P*m, n, k))
	got := make([]T, P*m*n)
	for name, run := range map[string]func(context.Context) error{"Run": o.Run, "RunSequential": o.RunSequential} {
		clear(got)
		if err := run(ctx); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if err := o.ReadC(got); err != nil {
			return err
		}
		if !bytes.Equal(asBytes(got), want) {
			return fmt.Errorf("%s: C differs from AllGather then one GEMM", name)
		}
	}
	return nil
}

// TestNewShapesAgree: New compares what the ranks planned (m, k, the
// element size and the gather's pieces; n is each rank's own) once, across
// the ranks. A difference is ErrSizeMismatch on every rank, and a shape
// one rank refuses ErrInvalid on every rank, each an *OpError naming the
// rank whose call differs (on that rank, a rank it differs from) and what
// differs, within the communicator's timeout; the ranks stay in step (a
// barrier after it succeeds). Where the ranks agree, C is bit for bit that
// of an all-gather followed by one GEMM, with random data.
func TestNewShapesAgree(t *testing.T) {
	good := plannedShape{m: 4, n: 3, k: 8, pieces: 4}
	for _, kind := range []device.Kind{device.CPU, device.CUDA} {
		for _, tc := range []struct {
			name string
			P    int
			odd  int          // the rank that plans odd
			sh   plannedShape // what it plans
			want error        // nil: every rank plans and runs
			what string       // what every rank's error says
		}{
			{"agree", 2, 1, good, nil, ""},
			{"n-is-local", 2, 1, plannedShape{m: 4, n: 5, k: 8, pieces: 4}, nil, ""},
			{"m-k-swapped-same-bytes", 2, 1, plannedShape{m: 8, n: 3, k: 4, pieces: 4}, collective.ErrSizeMismatch, "rank 1 plans m=8 k=4"},
			{"m-zero", 2, 1, plannedShape{m: 0, n: 3, k: 8, pieces: 4}, collective.ErrSizeMismatch, "rank 1 plans m=0 k=8"},
			{"pieces", 2, 0, plannedShape{m: 4, n: 3, k: 8, pieces: 2}, collective.ErrSizeMismatch, "2 pieces"},
			{"elements", 2, 1, plannedShape{m: 4, n: 3, k: 8, pieces: 4, f64: true}, collective.ErrSizeMismatch, "8-byte elements"},
			{"k-one-of-three", 3, 2, plannedShape{m: 4, n: 3, k: 9, pieces: 4}, collective.ErrSizeMismatch, "rank 2 plans m=4 k=9"},
			{"m-negative", 2, 1, plannedShape{m: -1, n: 3, k: 8, pieces: 4}, collective.ErrInvalid, "rank 1 refused"},
			{"m-negative-rank0", 3, 0, plannedShape{m: -1, n: 3, k: 8, pieces: 4}, collective.ErrInvalid, "rank 0 refused"},
		} {
			t.Run(fmt.Sprintf("%v/%s", kind, tc.name), func(t *testing.T) {
				const timeout = 5 * time.Second
				testranks.Run(t, 1, tc.P, func(o *collective.Options) {
					o.Backend, o.Timeout, o.GPUScratch = kind, timeout, 64<<10
				}, func(c *collective.Communicator) error {
					ctx := context.Background()
					sh := good
					if c.Rank() == tc.odd {
						sh = tc.sh
					}
					opts := Options{Pieces: sh.pieces, MinPieceBytes: -1}
					start := time.Now()
					var o opOf
					var err error
					if sh.f64 {
						var o64 *Op[float64]
						if o64, err = NewWith[float64](ctx, c, sh.m, sh.n, sh.k, opts); err == nil {
							o = o64 // not a nil *Op in o
						}
					} else {
						var o32 *Op[float32]
						if o32, err = NewWith[float32](ctx, c, sh.m, sh.n, sh.k, opts); err == nil {
							o = o32
							if tc.want == nil {
								err = bitsAgainstGather(ctx, c, o32, sh.m, sh.n, sh.k)
							}
						}
					}
					if o != nil {
						if tc.want != nil {
							// Planned without a word: run it, to show what
							// comes of it.
							err = o.Run(ctx)
						}
						if cerr := o.Close(); err == nil {
							err = cerr
						}
					}
					took := time.Since(start)
					if tc.want == nil {
						if err != nil {
							return err
						}
						return c.Barrier(ctx)
					}
					t.Logf("rank %d after %v: %v", c.Rank(), took.Round(time.Millisecond), err)
					var oe *collective.OpError
					switch {
					case !errors.Is(err, tc.want) || !errors.As(err, &oe):
						return fmt.Errorf("rank %d planned %+v: %v, want an *OpError wrapping %v", c.Rank(), sh, err, tc.want)
					case oe.Rank != c.Rank():
						return fmt.Errorf("rank %d: %v names rank %d", c.Rank(), err, oe.Rank)
					case c.Rank() != tc.odd && oe.Peer != tc.odd:
						return fmt.Errorf("rank %d: %v names peer %d, want %d", c.Rank(), err, oe.Peer, tc.odd)
					case c.Rank() != tc.odd && !strings.Contains(err.Error(), tc.what):
						return fmt.Errorf("rank %d: %v does not say %q", c.Rank(), err, tc.what)
					case took >= timeout:
						return fmt.Errorf("rank %d: %v after %v, the communicator's timeout", c.Rank(), err, took)
					}
					// Still in step: a collective after it pairs.
					return c.Barrier(ctx)
				})
			})
		}
	}
}
