package overlap

import (
	"context"
	"fmt"
	"unsafe"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas32"
	"gonum.org/v1/gonum/blas/blas64"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/device"
)

// Float is the element types an Op computes in.
type Float interface{ float32 | float64 }

// Op is a planned, overlapped C = AllGather(A)·B on one rank, on the
// communicator's backend. Write A (this rank's m × k rows) and B (k × n),
// then Run; C holds the (P·m) × n result, row-major, and G the gathered A.
// Run it as often as needed; once planned, a run allocates nothing.
//
// Where the memory lives is the one thing that depends on the backend: on
// the CPU, A, B, C and G are host slices that the caller reads and writes
// in place; on CUDA they are device buffers (DevA, DevB, DevC, DevG) and
// the host slices are nil. WriteA, WriteB, ReadC and ReadG copy on either.
//
// The gather is the communicator's own: one planned all-gather
// ([collective.Communicator.PlanBlocks], or PlanGPUBlocks on a GPU) per
// piece, within a node and across nodes alike.
type Op[T Float] struct {
	// A (m × k), B (k × n), C ((P·m) × n) and G ((P·m) × k, this rank's own
	// rows included) in host memory: nil on the CUDA backend.
	A, B, C, G []T
	// The same on the GPU: nil on the CPU backend.
	DevA, DevB, DevC, DevG *device.CUDABuffer

	c       *collective.Communicator
	P, me   int
	m, n, k int
	pieces  []Piece
	tasks   []Task
	plans   []*collective.Plan // one per piece
	eng     engine
}

// engine is an Op's executor: gonum on host memory, or cuBLAS on the GPU.
// Each call runs the Op's plans and tasks to completion.
type engine interface {
	run(ctx context.Context) error
	sequential(ctx context.Context) error
	gather(ctx context.Context) error
	gemm(ctx context.Context) error
	mode() string
	close() error
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
// It is a collective call: every rank plans the same shape.
func New[T Float](ctx context.Context, c *collective.Communicator, m, n, k, pieces int) (*Op[T], error) {
	return NewWith[T](ctx, c, m, n, k, Options{Pieces: max(pieces, 1)})
}

// NewWith is New with its settings in opts.
func NewWith[T Float](ctx context.Context, c *collective.Communicator, m, n, k int, opts Options) (o *Op[T], err error) {
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
	o = &Op[T]{c: c, P: P, me: me, m: m, n: n, k: k}
	esz := o.esz()
	o.pieces = Pieces(m, PieceCount(opts.Pieces, m*k*esz, opts.MinPieceBytes))
	o.tasks = Tasks(P, me, m, o.pieces)
	// Each engine's constructor releases what it made when it fails; o.eng
	// is set only on success (a failed constructor's nil pointer would not
	// be a nil engine).
	if c.Backend() == device.CUDA {
		eng, err := newGPUEngine(ctx, o)
		if err != nil {
			return nil, err
		}
		o.eng = eng
	} else {
		eng, err := newHostEngine(o)
		if err != nil {
			return nil, err
		}
		o.eng = eng
	}
	return o, nil
}

// closed is what a call on a closed Op returns.
func (o *Op[T]) closed(op string) error {
	return &collective.OpError{Op: op, Rank: o.me, Peer: -1, Err: collective.ErrClosed, Detail: "the overlap Op is closed"}
}

// blocks is the placement of piece p in G: rank r's rows of the piece, at
// their place in r's block.
func (o *Op[T]) blocks(p Piece) (sizes, offs []int) {
	esz := o.esz()
	sizes, offs = make([]int, o.P), make([]int, o.P)
	for r := range o.P {
		sizes[r] = (p.Hi - p.Lo) * o.k * esz
		offs[r] = (r*o.m + p.Lo) * o.k * esz
	}
	return sizes, offs
}

func (o *Op[T]) esz() int {
	var z T
	return int(unsafe.Sizeof(z))
}

// DefaultPieces is how many pieces NewWith cuts the gather into unless told.
const DefaultPieces = 4

// Pieces is the number of pieces the gather is cut into.
func (o *Op[T]) Pieces() int { return len(o.pieces) }

// Mode says how the Op's gather runs: "host" on the CPU backend; on the
// GPU, its plans' mode ("graph", "eager", "staged" across nodes, or
// "host-staged"); "closed" once closed.
func (o *Op[T]) Mode() string {
	if o.eng == nil {
		return "closed"
	}
	return o.eng.mode()
}

// MinPieceBytes is the least a gather piece should carry per rank on c:
// across nodes, the smallest message that the transport stripes over every
// connection of a peer pair (c.StripeBytes()); a smaller one moves slower,
// which costs more than a finer overlap gains (docs/PERFORMANCE.md). 0 on
// one node.
func MinPieceBytes(c *collective.Communicator) int {
	return c.StripeBytes()
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

// WriteA copies a (m × k) into A, WriteB b (k × n) into B, wherever they
// live. Not ordered after a run in flight: write between runs.
func (o *Op[T]) WriteA(a []T) error { return o.write("A", o.A, o.DevA, a, o.m*o.k) }
func (o *Op[T]) WriteB(b []T) error { return o.write("B", o.B, o.DevB, b, o.k*o.n) }

// ReadC copies C ((P·m) × n) into c, ReadG the gathered A ((P·m) × k) into
// g, wherever they live.
func (o *Op[T]) ReadC(c []T) error { return o.read("C", c, o.C, o.DevC, o.P*o.m*o.n) }
func (o *Op[T]) ReadG(g []T) error { return o.read("G", g, o.G, o.DevG, o.P*o.m*o.k) }

func (o *Op[T]) write(name string, host []T, dev *device.CUDABuffer, src []T, want int) error {
	if len(src) != want {
		return fmt.Errorf("overlap: %s takes %d elements, not %d: %w", name, want, len(src), collective.ErrInvalid)
	}
	if dev != nil {
		return dev.CopyFromHost(asBytes(src))
	}
	copy(host, src)
	return nil
}

func (o *Op[T]) read(name string, dst, host []T, dev *device.CUDABuffer, want int) error {
	if len(dst) != want {
		return fmt.Errorf("overlap: %s holds %d elements, not %d: %w", name, want, len(dst), collective.ErrInvalid)
	}
	if dev != nil {
		return dev.CopyToHost(asBytes(dst))
	}
	copy(dst, host)
	return nil
}

// Run computes C, overlapping each gather piece with the GEMMs that do not
// need it: this rank's own rows first, then each piece's rows once the
// piece is gathered. An error of the gather (a lost peer, a timeout) ends
// the run and is returned.
func (o *Op[T]) Run(ctx context.Context) error {
	if o.eng == nil {
		return o.closed("overlap")
	}
	return o.eng.run(ctx)
}

// RunSequential gathers all of A, then computes all of C: the baseline the
// overlap is measured against (t_seq).
func (o *Op[T]) RunSequential(ctx context.Context) error {
	if o.eng == nil {
		return o.closed("overlap")
	}
	return o.eng.sequential(ctx)
}

// Gather runs only the gather (t_comm).
func (o *Op[T]) Gather(ctx context.Context) error {
	if o.eng == nil {
		return o.closed("overlap")
	}
	return o.eng.gather(ctx)
}

// GEMM runs only the GEMMs, on whatever G holds (t_gemm).
func (o *Op[T]) GEMM(ctx context.Context) error {
	if o.eng == nil {
		return o.closed("overlap")
	}
	return o.eng.gemm(ctx)
}

// Close releases the Op's streams, plans and memory. It is a collective
// call on the GPU (its plans' Close is).
func (o *Op[T]) Close() error {
	var err error
	if o.eng != nil {
		err = o.eng.close()
		o.eng = nil
	}
	return err
}

// hostEngine runs an Op on host memory. The calling goroutine runs the
// gather, piece by piece (the communicator's plans, with the call's
// context); a device.CPUStream runs the GEMMs, each piece's once that piece
// is gathered, so that they overlap the pieces that follow.
type hostEngine[T Float] struct {
	o       *Op[T]
	compute *device.CPUStream
	taskFns []func() error // made once: a run allocates nothing
}

func newHostEngine[T Float](o *Op[T]) (*hostEngine[T], error) {
	P, m, n, k := o.P, o.m, o.n, o.k
	o.A, o.B, o.C, o.G = make([]T, m*k), make([]T, k*n), make([]T, P*m*n), make([]T, P*m*k)
	e := &hostEngine[T]{o: o, compute: device.NewCPUStream()}
	esz := o.esz()
	gBytes, aBytes := asBytes(o.G), asBytes(o.A)
	for _, p := range o.pieces {
		sizes, offs := o.blocks(p)
		plan, err := o.c.PlanBlocks(gBytes, aBytes[p.Lo*k*esz:p.Hi*k*esz], sizes, offs)
		if err != nil {
			e.close()
			return nil, err
		}
		o.plans = append(o.plans, plan)
	}
	for _, t := range o.tasks {
		e.taskFns = append(e.taskFns, func() error { e.gemmTask(t); return nil })
	}
	return e, nil
}

func (e *hostEngine[T]) mode() string { return "host" }

// gemmTask computes C rows of task t: rows of this rank's A for its own
// block, of the gathered G for the others'.
func (e *hostEngine[T]) gemmTask(t Task) {
	o := e.o
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

func (e *hostEngine[T]) run(ctx context.Context) error {
	tasks, i := e.o.tasks, 0
	for ; i < len(tasks) && tasks[i].Piece < 0; i++ {
		e.compute.Launch(e.taskFns[i]) // own rows: no gather needed
	}
	for p, plan := range e.o.plans {
		if err := plan.Run(ctx); err != nil {
			e.compute.Synchronize(ctx) // the GEMMs launched read A and G
			return err
		}
		for ; i < len(tasks) && tasks[i].Piece == p; i++ {
			e.compute.Launch(e.taskFns[i])
		}
	}
	return e.compute.Synchronize(ctx)
}

func (e *hostEngine[T]) sequential(ctx context.Context) error {
	if err := e.gather(ctx); err != nil {
		return err
	}
	return e.gemm(ctx)
}

func (e *hostEngine[T]) gather(ctx context.Context) error {
	for _, plan := range e.o.plans {
		if err := plan.Run(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (e *hostEngine[T]) gemm(ctx context.Context) error {
	for _, fn := range e.taskFns {
		e.compute.Launch(fn)
	}
	return e.compute.Synchronize(ctx)
}

func (e *hostEngine[T]) close() error {
	for _, p := range e.o.plans {
		p.Close()
	}
	return e.compute.Close()
}

// Multiply returns a (rows × k) · b (k × n), row-major, with the same GEMM
// an Op uses on the CPU: the reference its results are checked against.
func Multiply[T Float](a, b []T, rows, n, k int) []T {
	c := make([]T, rows*n)
	if rows > 0 && n > 0 && k > 0 {
		gemmRows(a, b, c, rows, n, k)
	}
	return c
}
