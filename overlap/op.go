package overlap

import (
	"context"
	"fmt"
	"time"
	"unsafe"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas32"
	"gonum.org/v1/gonum/blas/blas64"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/inter"
)

// Float is the element types an Op computes in.
type Float interface{ float32 | float64 }

// Op is a planned, overlapped C = AllGather(A)·B on one rank. Fill A (this
// rank's m × k rows) and B (k × n), then Run; C holds the (P·m) × n result,
// row-major. Run it as often as needed.
type Op[T Float] struct {
	A, B, C []T
	// G is the gathered A, (P·m) × k; this rank's own rows are copied in too.
	G []T

	c             *collective.Communicator
	P, me         int
	m, n, k       int
	pieces        []Piece
	tasks         []Task
	plans         []*collective.Plan
	comm, compute *device.Stream
	events        []*device.Event
	gatherFns     []func() error
	taskFns       []func() error
	ctx           context.Context
}

// Options are NewWith's settings; the zero value asks for the defaults.
type Options struct {
	// Pieces is how many pieces the gather is cut into (default 4), fewer
	// where a piece would carry less than MinPieceBytes per rank.
	Pieces int
	// MinPieceBytes is the least a piece carries per rank: 0 for
	// MinPieceBytes(c), which suits a link whose processors bound it; on
	// one that the wire bounds (a NIC), smaller pieces hide more of the
	// gather. Negative: no least.
	MinPieceBytes int
}

// New plans an Op for m × k blocks of A on each rank of c, B of k × n, and
// the gather cut into the given number of pieces (at least 1; across nodes
// fewer where a piece would carry less than MinPieceBytes(c) per rank).
func New[T Float](c *collective.Communicator, m, n, k, pieces int) (*Op[T], error) {
	return NewWith[T](c, m, n, k, Options{Pieces: max(pieces, 1)})
}

// NewWith is New with its settings in opts.
func NewWith[T Float](c *collective.Communicator, m, n, k int, opts Options) (*Op[T], error) {
	if m < 0 || n < 0 || k < 0 {
		return nil, fmt.Errorf("overlap: negative shape %d×%d×%d: %w", m, n, k, collective.ErrInvalid)
	}
	if opts.Pieces <= 0 {
		opts.Pieces = DefaultPieces
	}
	if opts.MinPieceBytes == 0 {
		opts.MinPieceBytes = MinPieceBytes(c)
	}
	P, me := c.Size(), c.Rank()
	o := &Op[T]{c: c, P: P, me: me, m: m, n: n, k: k,
		A: make([]T, m*k), B: make([]T, k*n), C: make([]T, P*m*n), G: make([]T, P*m*k),
		comm: device.NewStream(), compute: device.NewStream()}
	// The gather's own waits end at the communicator's timeout; the compute
	// stream gives its events a little longer.
	o.compute.WaitTimeout = c.Timeout() + 10*time.Second
	var z T
	esz := int(unsafe.Sizeof(z))
	o.pieces = Pieces(m, PieceCount(opts.Pieces, m*k*esz, opts.MinPieceBytes))
	o.tasks = Tasks(P, me, m, o.pieces)
	gBytes, aBytes := asBytes(o.G), asBytes(o.A)
	sizes, offs := make([]int, P), make([]int, P)
	for _, p := range o.pieces {
		for r := range P {
			sizes[r] = (p.Hi - p.Lo) * k * esz
			offs[r] = (r*m + p.Lo) * k * esz
		}
		plan, err := c.PlanBlocks(gBytes, aBytes[p.Lo*k*esz:p.Hi*k*esz], sizes, offs)
		if err != nil {
			o.Close()
			return nil, err
		}
		o.plans = append(o.plans, plan)
		o.events = append(o.events, new(device.Event))
		o.gatherFns = append(o.gatherFns, func() error { return plan.Run(o.ctx) })
	}
	for _, t := range o.tasks {
		o.taskFns = append(o.taskFns, func() error { o.gemm(t); return nil })
	}
	return o, nil
}

// DefaultPieces is how many pieces NewWith cuts the gather into unless told.
const DefaultPieces = 4

// Pieces is the number of pieces the gather is cut into.
func (o *Op[T]) Pieces() int { return len(o.pieces) }

// MinPieceBytes is the least a gather piece should carry per rank on c:
// across nodes, the smallest message that the transport stripes over every
// connection of a peer pair (inter.Stripes); a smaller one moves slower,
// which costs more than a finer overlap gains: across two namespaces, with
// 4 connections (2 MiB), pieces of 2 MiB gave the shortest overlapped runs
// or ran even with the best, smaller ones up to 2.3 times as long (README). 0
// on one node.
func MinPieceBytes(c *collective.Communicator) int {
	return inter.StripeMin * c.Channels()
}

// PieceCount is how many pieces a gather of blockBytes per rank is cut
// into when n are asked for: no more than leave each piece minBytes (when
// minBytes > 0), and at least one.
func PieceCount(n, blockBytes, minBytes int) int {
	if minBytes > 0 {
		n = min(n, blockBytes/minBytes)
	}
	return max(n, 1)
}

// Bytes is s's memory as bytes (for copies to and from a GPU).
func Bytes[T Float](s []T) []byte { return asBytes(s) }

func asBytes[T Float](s []T) []byte {
	if len(s) == 0 {
		return []byte{}
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(z)))
}

// gemm computes C rows of task t: rows of this rank's A for its own block,
// of the gathered G for the others'.
func (o *Op[T]) gemm(t Task) {
	rows := t.Hi - t.Lo
	if rows == 0 || o.n == 0 {
		return
	}
	src, off := o.G, (t.Rank*o.m+t.Lo)*o.k
	if t.Rank == o.me {
		src, off = o.A, t.Lo*o.k
	}
	cOff := (t.Rank*o.m + t.Lo) * o.n
	if o.k == 0 { // an empty inner dimension: the product is zero
		clear(o.C[cOff : cOff+rows*o.n])
		return
	}
	gemmRows(src[off:off+rows*o.k], o.B, o.C[cOff:cOff+rows*o.n], rows, o.n, o.k)
}

// gemmRows computes c (rows × n) = a (rows × k) · b (k × n), row-major.
func gemmRows[T Float](a, b, c []T, rows, n, k int) {
	switch a := any(a).(type) {
	case []float32:
		blas32.Gemm(blas.NoTrans, blas.NoTrans, 1,
			blas32.General{Rows: rows, Cols: k, Stride: max(k, 1), Data: a},
			blas32.General{Rows: k, Cols: n, Stride: max(n, 1), Data: any(b).([]float32)},
			0, blas32.General{Rows: rows, Cols: n, Stride: max(n, 1), Data: any(c).([]float32)})
	case []float64:
		blas64.Gemm(blas.NoTrans, blas.NoTrans, 1,
			blas64.General{Rows: rows, Cols: k, Stride: max(k, 1), Data: a},
			blas64.General{Rows: k, Cols: n, Stride: max(n, 1), Data: any(b).([]float64)},
			0, blas64.General{Rows: rows, Cols: n, Stride: max(n, 1), Data: any(c).([]float64)})
	}
}

// Run computes C, overlapping each gather piece with the GEMMs that do not
// need it. An error of the gather (a lost peer, a timeout) ends the run on
// both streams and is returned.
func (o *Op[T]) Run(ctx context.Context) error {
	o.ctx = ctx
	for i, fn := range o.gatherFns {
		o.comm.Launch(fn)
		o.comm.Record(o.events[i])
	}
	for i, t := range o.tasks {
		if t.Piece >= 0 && (i == 0 || o.tasks[i-1].Piece != t.Piece) {
			o.compute.Wait(o.events[t.Piece])
		}
		o.compute.Launch(o.taskFns[i])
	}
	return o.sync(ctx)
}

// RunSequential gathers all of A, then computes all of C: the baseline the
// overlap is measured against (t_seq).
func (o *Op[T]) RunSequential(ctx context.Context) error {
	o.ctx = ctx
	for _, fn := range o.gatherFns {
		o.comm.Launch(fn)
	}
	if err := o.sync(ctx); err != nil {
		return err
	}
	for _, fn := range o.taskFns {
		o.compute.Launch(fn)
	}
	return o.sync(ctx)
}

// Gather runs only the gather (t_comm); GEMM only the GEMMs, on whatever
// G holds (t_gemm).
func (o *Op[T]) Gather(ctx context.Context) error {
	o.ctx = ctx
	for _, fn := range o.gatherFns {
		o.comm.Launch(fn)
	}
	return o.sync(ctx)
}

func (o *Op[T]) GEMM(ctx context.Context) error {
	for _, fn := range o.taskFns {
		o.compute.Launch(fn)
	}
	return o.sync(ctx)
}

func (o *Op[T]) sync(ctx context.Context) error {
	errComm := o.comm.Synchronize(ctx)
	errCompute := o.compute.Synchronize(ctx)
	if errComm != nil {
		return errComm
	}
	return errCompute
}

// Close stops the streams.
func (o *Op[T]) Close() {
	o.comm.Close()
	o.compute.Close()
}

// Multiply returns a (rows × k) · b (k × n), row-major, with the same GEMM
// an Op uses: the reference its results are checked against.
func Multiply[T Float](a, b []T, rows, n, k int) []T {
	c := make([]T, rows*n)
	if rows > 0 && n > 0 && k > 0 {
		gemmRows(a, b, c, rows, n, k)
	}
	return c
}
