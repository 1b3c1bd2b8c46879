package device_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/pattern"
)

func openGPU(t *testing.T) *device.GPU {
	t.Helper()
	if err := device.CUDAAvailable(); err != nil {
		t.Skipf("skipped: no GPU here (%v); runs where libslimecuda.so and a GPU are present (make device-check)", err)
	}
	g, err := device.OpenGPU(0)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// Without a GPU, asking for CUDA is a clear error and auto is the CPU.
func TestResolveWithoutGPU(t *testing.T) {
	if device.CUDAAvailable() == nil {
		t.Skip("a GPU is present")
	}
	if k, err := device.Resolve(device.Auto); err != nil || k != device.CPU {
		t.Errorf("Resolve(auto) = %v, %v; want cpu", k, err)
	}
	k, err := device.Resolve(device.CUDA)
	if !errors.Is(err, device.ErrUnavailable) || k != device.CPU {
		t.Errorf("Resolve(cuda) = %v, %v; want ErrUnavailable", k, err)
	}
	if _, err := device.OpenGPU(0); !errors.Is(err, device.ErrUnavailable) {
		t.Errorf("OpenGPU(0): %v, want ErrUnavailable", err)
	}
}

func TestGPUMemoryStreamsEvents(t *testing.T) {
	g := openGPU(t)
	const n = 1<<20 + 5
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
	in, out := make([]byte, n), make([]byte, n)
	pattern.Fill(in, 42)
	if err := a.CopyFromHost(in); err != nil {
		t.Fatal(err)
	}
	s, err := g.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	start, _ := g.NewEvent(true)
	end, _ := g.NewEvent(true)
	defer start.Close()
	defer end.Close()
	if err := start.Record(s); err != nil {
		t.Fatal(err)
	}
	if err := g.Lib().MemcpyAsync(g.Ordinal, b.Ptr, a.Ptr, n, s.H); err != nil {
		t.Fatal(err)
	}
	if err := end.Record(s); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := end.Synchronize(ctx); err != nil {
		t.Fatal(err)
	}
	if d, err := end.Since(start); err != nil || d <= 0 {
		t.Errorf("elapsed %v, %v", d, err)
	}
	if err := b.CopyToHost(out); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(in, out) {
		t.Fatal("device copy differs")
	}
	// A slice addresses the same memory.
	tail, err := b.Slice(n-5, 5)
	if err != nil {
		t.Fatal(err)
	}
	five := make([]byte, 5)
	if err := tail.CopyToHost(five); err != nil || !bytes.Equal(five, in[n-5:]) {
		t.Fatalf("slice: %x, %v", five, err)
	}
	if _, err := b.Slice(n-4, 5); err == nil {
		t.Error("a slice past the end was allowed")
	}
}
