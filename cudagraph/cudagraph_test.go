package cudagraph_test

import (
	"bytes"
	"context"
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
		t.Skipf("skipped: no GPU here (%v); runs where libslimecuda.so and a GPU are present (make device-check)", err)
	}
	g, err := device.OpenGPU(0)
	if err != nil {
		t.Fatal(err)
	}
	const n = 300_001
	for _, eager := range []bool{false, true} {
		a, _ := g.Alloc(n)
		b, _ := g.Alloc(n)
		s, err := g.NewStream()
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
