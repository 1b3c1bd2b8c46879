// Package device names the memory and execution backends slimego runs on
// and picks one: the CPU backend (host memory, shared memory between the
// ranks of a node) everywhere, the CUDA backend where its kernels library
// and a GPU are present.
//
// Both backends order work the same way: a stream runs work in order, an
// event marks a point in a stream for another stream to wait on, and every
// wait for the host has a deadline. [CPUStream] and [CPUEvent] are the CPU's
// (goroutine queues); [CUDAStream] and [CUDAEvent] are CUDA's, over
// libslimecuda.so (package kernels), with [GPU] the device and
// [CUDABuffer] its memory. Both stream kinds satisfy [Synchronizer].
package device

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/slimego/slimego/kernels"
)

// Kind is a backend.
type Kind int

const (
	// Auto picks CUDA where it can run and the CPU otherwise.
	Auto Kind = iota
	// CPU is host memory; ranks of one node share POSIX shared memory.
	CPU
	// CUDA is device memory; ranks of one node map each other's buffers
	// with CUDA IPC.
	CUDA
)

func (k Kind) String() string {
	switch k {
	case Auto:
		return "auto"
	case CPU:
		return "cpu"
	case CUDA:
		return "cuda"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// ErrUnavailable: the backend asked for cannot run on this machine.
var ErrUnavailable = errors.New("device: backend unavailable")

// Parse reads "cpu", "cuda" or "auto" (case-insensitive; empty is auto).
func Parse(s string) (Kind, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "auto":
		return Auto, nil
	case "cpu":
		return CPU, nil
	case "cuda", "gpu":
		return CUDA, nil
	}
	return Auto, fmt.Errorf("device: unknown backend %q (want cpu, cuda or auto)", s)
}

var warnUntrusted sync.Once

// Resolve turns a requested kind into the one that will run: Auto is CUDA
// where libslimecuda.so loads and sees a GPU, the CPU otherwise (the
// emulated library is a test harness: only an explicit CUDA runs on it);
// CUDA that cannot run is an error (wrapping ErrUnavailable) naming what is
// missing.
func Resolve(k Kind) (Kind, error) {
	switch k {
	case CPU:
		return CPU, nil
	case Auto:
		err := CUDAAvailable()
		if err == nil && !CUDAEmulated() {
			return CUDA, nil
		}
		if errors.Is(err, kernels.ErrUntrusted) {
			// A library that exists but was passed over would otherwise
			// leave a GPU host on the CPU without a word.
			warnUntrusted.Do(func() {
				fmt.Fprintf(os.Stderr, "slimego WARNING: the CPU backend runs: %v\n", err)
			})
		}
		return CPU, nil
	case CUDA:
		if err := CUDAAvailable(); err != nil {
			return CPU, fmt.Errorf("%w: cuda: %v; use the CPU backend (Options.Backend or SLIME_BACKEND cpu or auto; slimebench --backend)", ErrUnavailable, err)
		}
		return CUDA, nil
	}
	return CPU, fmt.Errorf("device: unknown backend %v", k)
}
