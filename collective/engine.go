package collective

import (
	"context"

	"github.com/slimego/slimego/inter"
	"github.com/slimego/slimego/intra"
)

// engine is the all-gather algorithm a communicator chose at Init for
// memory of kind M ([]byte on the host, intra.DevSpan on the GPU): the
// node's own gather on one node, the rail-aligned hierarchical all-gather
// or the ring across nodes. The communicator holds one value of it and
// never asks which it is.
type engine[M any] interface {
	// Plan prepares name(dst, src): rank r's sizes[r] bytes land at
	// offs[r] of dst.
	Plan(name string, dst, src M, sizes, offs []int) (planned[M], error)
	// Barrier returns once every rank of the engine has entered it.
	Barrier(ctx context.Context) error
}

// planned is one planned all-gather of an engine: Set re-aims it at other
// buffers (allocating nothing), Run performs it.
type planned[M any] interface {
	Set(dst, src M, sizes, offs []int) error
	Run(ctx context.Context) error
}

// The adapters below exist because each algorithm's Plan returns its own
// concrete op type.

// groupEngine is the shared-memory group of one node.
type groupEngine struct{ g *intra.Group }

func (e groupEngine) Plan(name string, dst, src []byte, sizes, offs []int) (planned[[]byte], error) {
	op, err := e.g.Plan(name, dst, src, sizes, offs)
	if err != nil {
		return nil, err
	}
	return op, nil
}

func (e groupEngine) Barrier(ctx context.Context) error { return e.g.Barrier(ctx) }

// hierEngine is the rail-aligned hierarchical all-gather across nodes.
type hierEngine[M any] struct{ h *inter.HierOver[M] }

func (e hierEngine[M]) Plan(name string, dst, src M, sizes, offs []int) (planned[M], error) {
	op, err := e.h.Plan(name, dst, src, sizes, offs)
	if err != nil {
		return nil, err
	}
	return op, nil
}

func (e hierEngine[M]) Barrier(ctx context.Context) error { return e.h.Barrier(ctx) }

// ringEngine is the ring all-gather across nodes.
type ringEngine[M any] struct{ r *inter.RingOver[M] }

func (e ringEngine[M]) Plan(name string, dst, src M, sizes, offs []int) (planned[M], error) {
	op, err := e.r.Plan(name, dst, src, sizes, offs)
	if err != nil {
		return nil, err
	}
	return op, nil
}

func (e ringEngine[M]) Barrier(ctx context.Context) error { return e.r.Barrier(ctx) }
