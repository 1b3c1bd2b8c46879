package cudagraph_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/slimego/slimego/cudagraph"
	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/pattern"
)

// A captured copy replays with the data of each run: graph and eager modes
// give the same bytes, and only graph mode captures.
func TestReplayFollowsData(t *testing.T) {
	if err := device.CUDAAvailable(); err != nil {
		t.Fatalf("no CUDA library (%v): TestMain points SLIME_CUDA_LIB at the emulator unless it names a library already", err)
	}
	g, err := device.OpenGPU(0)
	if err != nil {
		t.Fatal(err)
	}
	const n = 300_001
	for _, eager := range []bool{false, true} {
		a, _ := g.Alloc(n)
		b, _ := g.Alloc(n)
		s, err := g.NewCUDAStream()
		if err != nil {
			t.Fatal(err)
		}
		r := cudagraph.New(s, eager, func(s *device.CUDAStream) error {
			if err := g.Lib().MemsetAsync(g.Ordinal, b.Ptr, 0x5a, n, s.H); err != nil {
				return err
			}
			return g.Lib().MemcpyAsync(g.Ordinal, b.Ptr, a.Ptr, n-1, s.H)
		})
		in, out := make([]byte, n), make([]byte, n)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		for run := range 4 {
			pattern.Fill(in, uint64(run))
			if err := a.CopyFromHost(in); err != nil {
				t.Fatal(err)
			}
			if err := r.Run(); err != nil {
				t.Fatal(err)
			}
			if err := s.Synchronize(ctx); err != nil {
				t.Fatal(err)
			}
			if err := b.CopyToHost(out); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(out[:n-1], in[:n-1]) || out[n-1] != 0x5a {
				t.Fatalf("%s mode, run %d: wrong bytes", r.Mode(), run)
			}
		}
		if r.Captured() == eager {
			t.Errorf("%s mode: captured = %v", r.Mode(), r.Captured())
		}
		cancel()
		r.Close()
		s.Close()
		a.Free()
		b.Free()
	}
}

func TestEagerFromEnv(t *testing.T) {
	for v, want := range map[string]bool{"1": true, "true": true, "0": false, "": false, "false": false} {
		t.Setenv("SLIME_EAGER", v)
		if got := cudagraph.Eager(); got != want {
			t.Errorf("SLIME_EAGER=%q: Eager() = %v", v, got)
		}
	}
}

// A launcher that fails, or makes a call CUDA forbids during capture
// (querying the capturing stream, waiting on work outside the capture),
// makes Run fail with ErrCapture, whether the launcher passes the call's
// error on or not (the end of the capture fails then); the
// capture is ended all the same, so the stream takes ordinary work again
// and a Runner whose launcher then behaves captures on its next Run.
func TestCaptureFails(t *testing.T) {
	g, err := device.OpenGPU(0)
	if err != nil {
		t.Fatal(err)
	}
	const n = 4097
	a, err := g.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Free()
	b, err := g.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	s, err := g.NewCUDAStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	lib := g.Lib()
	bad := errors.New("the launcher's own error")
	for _, tc := range []struct {
		name   string
		launch cudagraph.Launcher
	}{
		{"launcher error", func(*device.CUDAStream) error { return bad }},
		// Relaxed capture (slime_graph_begin's mode) allows allocations and
		// synchronous copies; these CUDA refuses, and ends the capture as
		// invalidated.
		{"stream query", func(s *device.CUDAStream) error { return lib.StreamQuery(g.Ordinal, s.H) }},
		{"ignored stream query", func(s *device.CUDAStream) error {
			lib.StreamQuery(g.Ordinal, s.H) // the launcher misses it: GraphEnd does not
			return nil
		}},
		{"wait on uncaptured work", func(s *device.CUDAStream) error {
			other, err := g.NewCUDAStream()
			if err != nil {
				return err
			}
			defer other.Close()
			e, err := g.NewCUDAEvent(false)
			if err != nil {
				return err
			}
			defer e.Close()
			if err := e.Record(other); err != nil {
				return err
			}
			return s.Wait(e)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fail := true
			r := cudagraph.New(s, false, func(s *device.CUDAStream) error {
				if fail {
					return tc.launch(s)
				}
				return lib.MemcpyAsync(g.Ordinal, b.Ptr, a.Ptr, n, s.H)
			})
			defer r.Close()
			if err := r.Run(); !errors.Is(err, cudagraph.ErrCapture) {
				t.Fatalf("Run: %v, want ErrCapture", err)
			}
			if r.Captured() {
				t.Fatal("a failed capture left a graph")
			}
			// The stream left capture mode: ordinary work runs on it.
			in, out := make([]byte, n), make([]byte, n)
			pattern.Fill(in, 7)
			if err := a.CopyFromHost(in); err != nil {
				t.Fatal(err)
			}
			fail = false
			if err := r.Run(); err != nil {
				t.Fatalf("Run after the failure: %v", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := s.Synchronize(ctx); err != nil {
				t.Fatal(err)
			}
			if err := b.CopyToHost(out); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(in, out) || !r.Captured() {
				t.Fatalf("after a failed capture: bytes equal %v, captured %v", bytes.Equal(in, out), r.Captured())
			}
			if err := r.Close(); err != nil || r.Close() != nil {
				t.Errorf("Close: %v", err)
			}
		})
	}
}
