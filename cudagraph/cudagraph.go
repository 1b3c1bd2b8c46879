// Package cudagraph runs a plan's GPU work as a CUDA graph: captured on the
// plan's first run and replayed on every later one, so that a collective
// costs one graph launch instead of one launch per kernel. In eager mode
// (--eager-mode, SLIME_EAGER=1) the same work is launched directly, for
// debugging; the two give bit-identical results, because the kernels keep
// their per-call state (the epoch of the flag protocol) in device memory
// and advance it themselves instead of taking it as an argument.
//
// What a [Runner] captures must be the complete, fixed work of one run: the
// kernels and copies with their final arguments. Everything else (memory
// allocation, the IPC exchange of handles through the rendezvous store,
// waiting for the host) happens before the first run, never during capture.
//
// This is an engine package, not slimego's API: programs import
// collective, overlap, launcher and rendezvous, which choose the engine at
// Init and whose exported identifiers name no type of this package (a
// test, internal/depcheck, checks that).
package cudagraph

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/kernels"
)

// ErrCapture: the work could not be captured into a graph.
var ErrCapture = errors.New("cudagraph: capture failed")

// Launcher enqueues one run's work on s (and on streams that join s through
// events). It must enqueue the same work every time and must not allocate,
// exchange handles or wait for the device: it may run under capture.
type Launcher func(s *device.CUDAStream) error

// Runner runs a Launcher's work on one stream, as a graph or eagerly. The
// zero value is not usable; see New. A Runner is driven by one goroutine.
type Runner struct {
	stream *device.CUDAStream
	launch Launcher
	eager  bool
	graph  kernels.Graph
}

// New prepares to run launch's work on s; eager launches it directly
// every time, otherwise the first Run captures it.
func New(s *device.CUDAStream, eager bool, launch Launcher) *Runner {
	return &Runner{stream: s, launch: launch, eager: eager}
}

// Eager reports whether SLIME_EAGER asks for eager mode ("1", "true").
func Eager() bool {
	b, err := strconv.ParseBool(strings.TrimSpace(os.Getenv("SLIME_EAGER")))
	return err == nil && b
}

// Mode is "eager" or "graph".
func (r *Runner) Mode() string {
	if r.eager {
		return "eager"
	}
	return "graph"
}

// Captured reports whether the graph exists (graph mode, after the first Run).
func (r *Runner) Captured() bool { return r.graph != 0 }

// Run enqueues one run of the work on the stream; the caller synchronizes.
// The first Run in graph mode captures and instantiates the graph, unless
// Prepare did.
func (r *Runner) Run() error {
	if r.eager {
		return r.launch(r.stream)
	}
	if err := r.Prepare(); err != nil {
		return err
	}
	return r.stream.Dev.Lib().GraphLaunch(r.stream.Dev.Ordinal, r.graph, r.stream.H)
}

// Prepare captures and instantiates the graph now, in graph mode, unless
// done already (eager mode: nothing to do), without launching it: a
// plan's setup calls it before any peer can launch, so that a run's first
// launch does not capture (under lazy module loading, capturing a kernel's
// launch loads it, and a load waits for the whole device, where a peer's
// kernel may already spin waiting for this rank).
func (r *Runner) Prepare() error {
	if r.eager || r.graph != 0 {
		return nil
	}
	lib, dev := r.stream.Dev.Lib(), r.stream.Dev.Ordinal
	if err := lib.GraphBegin(dev, r.stream.H); err != nil {
		return fmt.Errorf("%w: %v", ErrCapture, err)
	}
	lerr := r.launch(r.stream)
	// End the capture whatever happened, or the stream stays in
	// capture mode.
	g, err := lib.GraphEnd(dev, r.stream.H)
	if lerr != nil {
		if g != 0 {
			lib.GraphDestroy(dev, g)
		}
		return fmt.Errorf("%w: %v", ErrCapture, lerr)
	}
	if err != nil {
		return fmt.Errorf("%w: %v", ErrCapture, err)
	}
	r.graph = g
	return nil
}

// Close releases the graph.
func (r *Runner) Close() error {
	if r.graph == 0 {
		return nil
	}
	err := r.stream.Dev.Lib().GraphDestroy(r.stream.Dev.Ordinal, r.graph)
	r.graph = 0
	return err
}
