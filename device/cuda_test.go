package device_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/pattern"
)

func openGPU(t *testing.T) *device.GPU {
	t.Helper()
	if err := device.CUDAAvailable(); err != nil {
		t.Fatalf("no CUDA library (%v): TestMain points SLIME_CUDA_LIB at the emulator unless it names a library already", err)
	}
	g, err := device.OpenGPU(0)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestResolveWithoutGPU: without a CUDA library, asking for CUDA is a
// clear error and auto is the CPU; with one (the emulator under make test,
// libslimecuda.so on a GPU machine), CUDA resolves and device 0 opens. The
// no-library case runs in a child process of this test binary whose
// SLIME_CUDA_LIB names a file that does not exist (the loader, once it has
// tried a library, does not try again), so neither case is skipped.
func TestResolveWithoutGPU(t *testing.T) {
	if os.Getenv("SLIME_DEVICE_TEST_NOLIB") == "1" {
		if err := device.CUDAAvailable(); err == nil {
			t.Fatalf("CUDA is available with SLIME_CUDA_LIB=%s", os.Getenv("SLIME_CUDA_LIB"))
		}
		if device.CUDAEmulated() {
			t.Error("CUDAEmulated() with no library")
		}
		if k, err := device.Resolve(device.Auto); err != nil || k != device.CPU {
			t.Errorf("Resolve(auto) = %v, %v; want cpu", k, err)
		}
		k, err := device.Resolve(device.CUDA)
		if !errors.Is(err, device.ErrUnavailable) || k != device.CPU {
			t.Errorf("Resolve(cuda) = %v, %v; want ErrUnavailable", k, err)
		}
		if err == nil || !strings.Contains(err.Error(), "SLIME_CUDA_LIB") {
			t.Errorf("Resolve(cuda): %v; want the error to say how to name the library", err)
		}
		if _, err := device.OpenGPU(0); !errors.Is(err, device.ErrUnavailable) {
			t.Errorf("OpenGPU(0): %v, want ErrUnavailable", err)
		}
		if _, err := device.OpenLocalGPU(0); !errors.Is(err, device.ErrUnavailable) {
			t.Errorf("OpenLocalGPU(0): %v, want ErrUnavailable", err)
		}
		return
	}
	t.Run("library", func(t *testing.T) {
		g := openGPU(t)
		if k, err := device.Resolve(device.CUDA); err != nil || k != device.CUDA {
			t.Errorf("Resolve(cuda) = %v, %v; want cuda", k, err)
		}
		if g.Emulated() != device.CUDAEmulated() {
			t.Errorf("GPU.Emulated() = %v, CUDAEmulated() = %v", g.Emulated(), device.CUDAEmulated())
		}
		// Auto takes a real GPU, never the emulator: a test harness.
		want := device.CUDA
		if g.Emulated() {
			want = device.CPU
		}
		if k, err := device.Resolve(device.Auto); err != nil || k != want {
			t.Errorf("Resolve(auto) = %v, %v with emulated %v; want %v", k, err, g.Emulated(), want)
		}
		if _, err := device.OpenGPU(-1); !errors.Is(err, device.ErrUnavailable) {
			t.Errorf("OpenGPU(-1): %v, want ErrUnavailable", err)
		}
		// A node's ranks share its GPUs round robin.
		n, _ := device.CUDADeviceCount()
		for _, local := range []int{0, n, 2*n + 1} {
			if d, err := device.OpenLocalGPU(local); err != nil || d.Ordinal != local%n {
				t.Errorf("OpenLocalGPU(%d) of %d devices: %v, %v; want GPU %d", local, n, d, err, local%n)
			}
		}
		t.Logf("%s, emulated %v", g, g.Emulated())
	})
	t.Run("no library", func(t *testing.T) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestResolveWithoutGPU$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), "SLIME_DEVICE_TEST_NOLIB=1",
			"SLIME_CUDA_LIB="+filepath.Join(t.TempDir(), "libslimecuda.so"))
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestResolveWithoutGPU") {
			t.Fatalf("child: %v\n%s", err, out)
		}
	})
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
	s, err := g.NewCUDAStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	start, _ := g.NewCUDAEvent(true)
	end, _ := g.NewCUDAEvent(true)
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
