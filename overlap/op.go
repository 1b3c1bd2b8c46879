package overlap

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"time"
	"unsafe"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/device"
)

// Float is the element types an Op computes in.
type Float interface{ float32 | float64 }

// Op is a planned, overlapped C = AllGather(A)·B on one rank, on the
// communicator's backend. Write A (this rank's m × k rows) and B (k × n)
// with WriteA and WriteB, then Run; ReadC copies out C, the (P·m) × n
// result, row-major, and ReadG the gathered A. Run it as often as needed;
// once planned, a run allocates nothing.
//
// The Op is the same on every backend: its four matrices are buffers of
// the communicator's device (host memory on the CPU, device memory on a
// GPU), and the copies in and out are the one way to reach them. The
// gather is the communicator's own: one planned all-gather of those
// buffers ([collective.Communicator.PlanBuffersBlocks]) per piece, within
// a node and across nodes alike.
type Op[T Float] struct {
	c         *collective.Communicator
	ranks, me int // the communicator's size, this rank
	m, n, k   int
	pieces    []Piece
	tasks     []Task
	eng       *engine // nil once closed
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
	// ComputeTimeout bounds a run's wait for its own GEMMs, which involve
	// no peer: the communicator's timeout bounds only the waits for the
	// gather. 0 (or negative): DefaultComputeTimeout, or the
	// communicator's timeout where that is longer. A run whose GEMMs are
	// not done by then returns ErrComputeTimeout.
	ComputeTimeout time.Duration
}

// DefaultComputeTimeout is Options.ComputeTimeout unless told: far beyond
// any GEMM an Op plans, a bound only against a device that stopped.
const DefaultComputeTimeout = 10 * time.Minute

// ErrComputeTimeout is a run's error where its GEMMs did not finish within
// Options.ComputeTimeout. It is this rank's own (an *collective.OpError
// naming the rank, no peer) and no ErrTimeout: the communicator is not
// broken by it. The GEMMs may still be running: every later call on the
// Op first waits for them, within ComputeTimeout again, and returns
// ErrComputeTimeout while they run, so that none reads or writes the
// matrices under them.
var ErrComputeTimeout = errors.New("overlap: the GEMMs did not finish within the compute timeout")

// New plans an Op for m × k blocks of A on each rank of c, B of k × n, and
// the gather cut into the given number of pieces (a number below 1 counts
// as 1, where NewWith's zero Pieces is DefaultPieces; across nodes fewer
// where a piece would carry less than MinPieceBytes(c) per rank).
// It is a collective call: every rank plans the same m and k, of the same
// element type, cut into the same pieces (n, B's and C's width, is each
// rank's own). Planning compares them across the ranks, once, before
// anything is allocated: where they differ on one rank, every rank's New
// returns ErrSizeMismatch naming a rank whose plan differs and what
// differs, and where one rank refuses its own shape (negative, or too
// large for int), that rank returns its ErrInvalid and every other rank
// ErrInvalid naming it. The gather's plans compare only byte counts, which
// a different m and k can share: without this a run would multiply
// misread rows and return nil.
func New[T Float](ctx context.Context, c *collective.Communicator, m, n, k, pieces int) (*Op[T], error) {
	return NewWith[T](ctx, c, m, n, k, Options{Pieces: max(pieces, 1)})
}

// NewWith is New with its settings in opts.
func NewWith[T Float](ctx context.Context, c *collective.Communicator, m, n, k int, opts Options) (o *Op[T], err error) {
	var z T
	esz := int(unsafe.Sizeof(z))
	if opts.Pieces <= 0 {
		opts.Pieces = DefaultPieces
	}
	if opts.MinPieceBytes == 0 {
		opts.MinPieceBytes = MinPieceBytes(c)
	}
	if opts.ComputeTimeout <= 0 {
		opts.ComputeTimeout = max(DefaultComputeTimeout, c.Timeout())
	}
	P, me := c.Size(), c.Rank()
	o = &Op[T]{c: c, ranks: P, me: me, m: m, n: n, k: k}
	bad := checkShape(c, m, n, k, esz)
	if bad == nil {
		o.pieces = Pieces(m, PieceCount(opts.Pieces, m*k*esz, opts.MinPieceBytes))
	}
	// Every rank takes part, a refusing one too, so that a refusal is
	// every rank's error rather than a peer's timeout.
	if err := agree(ctx, c, planned{m: m, n: n, k: k, esz: esz, pieces: len(o.pieces)}, bad); err != nil {
		return nil, err
	}
	o.tasks = Tasks(P, me, m, o.pieces)
	// newEngine releases what it made when it fails.
	if o.eng, err = newEngine(ctx, c, shape{P: P, me: me, m: m, n: n, k: k, esz: esz}, o.pieces, o.tasks, opts.ComputeTimeout); err != nil {
		return nil, err
	}
	return o, nil
}

// checkShape refuses, as ErrInvalid naming the rank, a negative shape and
// one whose matrices' byte counts (A's m·k, B's k·n, C's P·m·n and G's
// P·m·k elements of esz bytes) do not fit in int: their products would
// wrap, and the buffers planned from them be smaller than the shape.
func checkShape(c *collective.Communicator, m, n, k, esz int) error {
	P := c.Size()
	if why := shapeFault(P, m, n, k, esz); why != "" {
		return &collective.OpError{Op: "overlap-plan", Rank: c.Rank(), Peer: -1, Err: collective.ErrInvalid,
			Detail: fmt.Sprintf("shape %d×%d×%d of %d-byte elements on %d ranks: %s", m, n, k, esz, P, why)}
	}
	return nil
}

// shapeFault is why checkShape refuses a shape on P ranks, or "": the
// same words on every rank, which computes it from the plan a refusing
// rank published (agree).
func shapeFault(P, m, n, k, esz int) string {
	if m < 0 || n < 0 || k < 0 {
		return "negative"
	}
	for _, f := range [][]int{{m, k}, {k, n}, {P, m, n}, {P, m, k}} {
		prod := uint64(esz)
		for _, x := range f {
			hi, lo := bits.Mul64(prod, uint64(x))
			if hi != 0 || lo > math.MaxInt {
				return "a matrix's size overflows int"
			}
			prod = lo
		}
	}
	return ""
}

// closed is what a call on a closed Op returns.
func (o *Op[T]) closed(op string) error {
	return &collective.OpError{Op: op, Rank: o.me, Peer: -1, Err: collective.ErrClosed, Detail: "the overlap Op is closed"}
}

func (o *Op[T]) esz() int {
	var z T
	return int(unsafe.Sizeof(z))
}

// DefaultPieces is how many pieces NewWith cuts the gather into unless told.
const DefaultPieces = 4

// Pieces is the number of pieces the gather is cut into.
func (o *Op[T]) Pieces() int { return len(o.pieces) }

// Mode says how the Op's gather runs: its plans' mode, "host" on the CPU
// backend and on the GPU "graph", "eager", "staged" across nodes, or
// "host-staged"; "closed" once closed.
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

// Bytes is s's memory as bytes (for copies to and from a device buffer).
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
func (o *Op[T]) WriteA(a []T) error { return o.write("A", matA, a, o.m*o.k) }
func (o *Op[T]) WriteB(b []T) error { return o.write("B", matB, b, o.k*o.n) }

// ReadC copies C ((P·m) × n) into c, ReadG the gathered A ((P·m) × k) into
// g, wherever they live.
func (o *Op[T]) ReadC(c []T) error { return o.read("C", matC, c, o.ranks*o.m*o.n) }
func (o *Op[T]) ReadG(g []T) error { return o.read("G", matG, g, o.ranks*o.m*o.k) }

func (o *Op[T]) write(name string, which int, src []T, want int) error {
	if o.eng == nil {
		return o.closed("overlap")
	}
	if len(src) != want {
		return fmt.Errorf("overlap: %s takes %d elements, not %d: %w", name, want, len(src), collective.ErrInvalid)
	}
	if err := o.eng.settle("overlap"); err != nil {
		return err
	}
	return o.eng.mats[which].CopyIn(asBytes(src))
}

func (o *Op[T]) read(name string, which int, dst []T, want int) error {
	if o.eng == nil {
		return o.closed("overlap")
	}
	if len(dst) != want {
		return fmt.Errorf("overlap: %s holds %d elements, not %d: %w", name, want, len(dst), collective.ErrInvalid)
	}
	if err := o.eng.settle("overlap"); err != nil {
		return err
	}
	return o.eng.mats[which].CopyOut(asBytes(dst))
}

// Run computes C, overlapping each gather piece with the GEMMs that do not
// need it: this rank's own rows first, then each piece's rows once the
// piece is gathered. An error of the gather (a lost peer, a timeout) ends
// the run and is returned. The communicator's timeout bounds the waits for
// the gather, Options.ComputeTimeout the wait for the GEMMs. Whatever it
// returns, the run's work is done by then (within those bounds): a run
// that fails, its context cancelled included, first waits for what it
// enqueued, so that nothing writes C or G after it returns; only where
// that wait gives up (ErrComputeTimeout) may GEMMs still run, and later
// calls wait for them first.
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

// GEMM runs only the GEMMs, on whatever G holds (t_gemm). It is local: it
// takes part in no collective, so it needs no counterpart on the peers
// (and a Run on one rank meets no GEMM on another: its gather pairs with
// the peer's next gather).
func (o *Op[T]) GEMM(ctx context.Context) error {
	if o.eng == nil {
		return o.closed("overlap")
	}
	return o.eng.gemmOnly(ctx)
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

// Multiply returns a (rows × k) · b (k × n), row-major, with the GEMM an
// Op uses on the CPU (device.MultiplyHost): the reference its results are
// checked against.
func Multiply[T Float](a, b []T, rows, n, k int) []T {
	c := make([]T, rows*n)
	if err := device.MultiplyHost(a, b, c, rows, n, k); err != nil {
		panic("overlap: Multiply: " + err.Error())
	}
	return c
}
