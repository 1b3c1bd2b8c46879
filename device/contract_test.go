package device_test

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/pattern"
)

// inChild runs the calling test in a child process of the test binary
// and reports the child's failure or crash here: a call that, wrongly
// accepted, would crash the process (a segfault in the CUDA library, a
// panic on a stream's goroutine) fails the test instead of ending the
// binary. It returns true in the child, which runs the test's body.
func inChild(t *testing.T) bool {
	t.Helper()
	if os.Getenv("SLIME_DEVICE_TEST_CHILD") == t.Name() {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "SLIME_DEVICE_TEST_CHILD="+t.Name())
	out, err := cmd.CombinedOutput()
	if len(out) > 4000 {
		out = append(out[:4000:4000], "\n[...]"...) // a crash's goroutine dump
	}
	if err != nil {
		t.Fatalf("the child process failed (%v):\n%s", err, out)
	}
	if !bytes.Contains(out, []byte("--- PASS: "+t.Name())) {
		t.Fatalf("the child process did not pass %s:\n%s", t.Name(), out)
	}
	return false
}

// TestGEMMShapeOverflow: a shape whose byte counts overflow int (m·k·4
// wraps to 0 for m = 2^62) is larger than any buffer and is refused before
// anything is enqueued, on both backends; on CUDA a dimension above
// MaxInt32 (cuBLAS takes int) is refused too. The CPU stream is held
// behind a gate so that a product wrongly accepted is reported, not run
// (it would index past its slices on the stream's goroutine).
func TestGEMMShapeOverflow(t *testing.T) {
	for _, bk := range backends(t) {
		t.Run(bk.name, func(t *testing.T) {
			d := bk.dev(t)
			g, s := gemmAndStream(t, d)
			gate := make(chan struct{})
			if cs, ok := s.(*device.CPUStream); ok {
				cs.Launch(func() error { <-gate; return nil })
			}
			bufs := make([]device.Buffer, 3)
			for i := range bufs {
				var err error
				if bufs[i], err = d.NewBuffer(8); err != nil {
					t.Fatal(err)
				}
				defer bufs[i].Free()
			}
			a, b, c := bufs[0], bufs[1], bufs[2]
			shapes := [][3]int{{1 << 62, 1, 1}, {1, 1 << 62, 1}, {1, 1, 1 << 62}, {1 << 31, 1 << 31, 1 << 2}, {math.MaxInt, math.MaxInt, 1}}
			if d.Kind() == device.CUDA {
				shapes = append(shapes, [3]int{1 << 32, 0, 0}, [3]int{0, 1 << 32, 0}, [3]int{0, 0, 1 << 32})
			}
			accepted := false
			for _, sh := range shapes {
				if err := g.F32(s, sh[0], sh[1], sh[2], a, b, c); err == nil {
					t.Errorf("F32 %d×%d×%d on 8-byte buffers: no error", sh[0], sh[1], sh[2])
					accepted = true
				}
				if err := g.F64(s, sh[0], sh[1], sh[2], a, b, c); err == nil {
					t.Errorf("F64 %d×%d×%d on 8-byte buffers: no error", sh[0], sh[1], sh[2])
					accepted = true
				}
			}
			if accepted {
				return // leave the gate shut: the accepted product must not run
			}
			close(gate)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := s.Synchronize(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestViewOverflow: View's bounds hold for any off and n, also where
// off+n overflows int, on both backends.
func TestViewOverflow(t *testing.T) {
	for _, bk := range backends(t) {
		t.Run(bk.name, func(t *testing.T) {
			d := bk.dev(t)
			b, err := d.NewBuffer(64)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Free()
			for _, r := range [][2]int{{16, math.MaxInt}, {math.MaxInt, 1}, {math.MaxInt, math.MaxInt}, {65, 0}, {1, math.MaxInt - 1}} {
				func() {
					defer func() {
						if p := recover(); p != nil {
							t.Errorf("View(%d, %d) of 64 bytes panicked: %v", r[0], r[1], p)
						}
					}()
					if v, err := b.View(r[0], r[1]); err == nil {
						t.Errorf("View(%d, %d) of 64 bytes: a view of %d bytes", r[0], r[1], v.Size())
					}
				}()
			}
		})
	}
}

// TestFreeView: freeing a view frees none of the buffer's memory, on both
// backends; the buffer keeps its contents and copies in and out. (On CUDA
// a view's Free released the parent's allocation, and the next copy into
// it crashed the library: the test runs in a child process.)
func TestFreeView(t *testing.T) {
	if !inChild(t) {
		return
	}
	for _, bk := range backends(t) {
		t.Run(bk.name, func(t *testing.T) {
			d := bk.dev(t)
			b, err := d.NewBuffer(64)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Free()
			for _, r := range [][2]int{{0, 32}, {16, 32}} {
				v, err := b.View(r[0], r[1])
				if err != nil {
					t.Fatal(err)
				}
				if err := v.Free(); err != nil {
					t.Errorf("Free of view [%d, +%d): %v", r[0], r[1], err)
				}
			}
			in, out := make([]byte, 64), make([]byte, 64)
			pattern.Fill(in, 5)
			if err := b.CopyIn(in); err != nil {
				t.Fatal(err)
			}
			if err := b.CopyOut(out); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(in, out) {
				t.Fatal("the buffer's bytes changed after its views were freed")
			}
		})
	}
}

// TestBufferContract holds both backends to one Buffer contract: CopyIn
// takes at most Size bytes and CopyOut fills at most Size bytes (the
// start of the buffer; more is an error, fewer is fine); Free makes Size
// 0, a copy of a freed buffer (or a freed view) is ErrFreed and crashes
// nothing, and a second Free is nil. It runs in a child process: a copy
// of a freed CUDA buffer used to pass the library a null pointer.
func TestBufferContract(t *testing.T) {
	if !inChild(t) {
		return
	}
	for _, bk := range backends(t) {
		t.Run(bk.name, func(t *testing.T) {
			d := bk.dev(t)
			b, err := d.NewBuffer(64)
			if err != nil {
				t.Fatal(err)
			}
			in := make([]byte, 64)
			pattern.Fill(in, 9)
			if err := b.CopyIn(in); err != nil {
				t.Fatal(err)
			}
			for _, n := range []int{0, 1, 63, 64} {
				out := make([]byte, n)
				if err := b.CopyOut(out); err != nil || !bytes.Equal(out, in[:n]) {
					t.Errorf("CopyOut into %d bytes: %v", n, err)
				}
				if err := b.CopyIn(in[:n]); err != nil {
					t.Errorf("CopyIn of %d bytes: %v", n, err)
				}
			}
			if err := b.CopyOut(make([]byte, 65)); err == nil {
				t.Error("CopyOut into 65 bytes of a 64-byte buffer: no error")
			}
			if err := b.CopyIn(make([]byte, 65)); err == nil {
				t.Error("CopyIn of 65 bytes into a 64-byte buffer: no error")
			}
			v, err := b.View(8, 16)
			if err != nil {
				t.Fatal(err)
			}
			if err := v.Free(); err != nil {
				t.Fatal(err)
			}
			if v.Size() != 0 {
				t.Errorf("a freed view's Size is %d", v.Size())
			}
			if err := v.CopyOut(make([]byte, 4)); !errors.Is(err, device.ErrFreed) {
				t.Errorf("CopyOut of a freed view: %v, want ErrFreed", err)
			}
			if err := b.Free(); err != nil {
				t.Fatal(err)
			}
			if b.Size() != 0 {
				t.Errorf("a freed buffer's Size is %d", b.Size())
			}
			for _, n := range []int{0, 4} {
				if err := b.CopyOut(make([]byte, n)); !errors.Is(err, device.ErrFreed) {
					t.Errorf("CopyOut of %d bytes of a freed buffer: %v, want ErrFreed", n, err)
				}
				if err := b.CopyIn(make([]byte, n)); !errors.Is(err, device.ErrFreed) {
					t.Errorf("CopyIn of %d bytes into a freed buffer: %v, want ErrFreed", n, err)
				}
			}
			if _, err := b.View(0, 0); !errors.Is(err, device.ErrFreed) {
				t.Errorf("View of a freed buffer: %v, want ErrFreed", err)
			}
			if err := b.Free(); err != nil {
				t.Errorf("second Free: %v", err)
			}
		})
	}
}

// TestGPUMixedDevices: a GEMM or copy that joins buffers or a stream of
// another GPU than its own is ErrMixedBackends, before anything is
// enqueued. The other GPU is device 0 under another ordinal (its memory is
// real, so that a call wrongly accepted runs harmlessly).
func TestGPUMixedDevices(t *testing.T) {
	g := openGPU(t)
	other := *g
	other.Ordinal = g.Ordinal + 1
	s, err := g.NewCUDAStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	mine := make([]*device.CUDABuffer, 3)
	for i := range mine {
		if mine[i], err = g.Alloc(64); err != nil {
			t.Fatal(err)
		}
		defer mine[i].Free()
	}
	foreign := &device.CUDABuffer{Dev: &other, Ptr: mine[2].Ptr, Len: mine[2].Len}
	foreignStream := &device.CUDAStream{Dev: &other, H: s.H}
	gm, err := g.NewGEMM()
	if err != nil {
		t.Fatal(err)
	}
	defer gm.Close()
	if err := gm.F32(s, 4, 4, 4, mine[0], mine[1], foreign); !errors.Is(err, device.ErrMixedBackends) {
		t.Errorf("GEMM into another GPU's buffer: %v", err)
	}
	if err := gm.F32(foreignStream, 4, 4, 4, mine[0], mine[1], mine[2]); !errors.Is(err, device.ErrMixedBackends) {
		t.Errorf("GEMM on another GPU's stream: %v", err)
	}
	if err := g.Copy(s, foreign, mine[0]); !errors.Is(err, device.ErrMixedBackends) {
		t.Errorf("copy into another GPU's buffer: %v", err)
	}
	if err := g.Copy(foreignStream, mine[1], mine[0]); !errors.Is(err, device.ErrMixedBackends) {
		t.Errorf("copy on another GPU's stream: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Synchronize(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestCUDAStreamClosed: a closed CUDA stream takes no more work and
// answers no wait: Record, Wait, a GEMM, a copy and Synchronize on it are
// ErrStreamClosed (its handle, zeroed by Close, would otherwise name the
// device's legacy stream, and the work would run there unordered).
func TestCUDAStreamClosed(t *testing.T) {
	g := openGPU(t)
	s, err := g.NewCUDAStream()
	if err != nil {
		t.Fatal(err)
	}
	e, err := g.NewCUDAEvent(false)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	bufs := make([]*device.CUDABuffer, 3)
	for i := range bufs {
		if bufs[i], err = g.Alloc(64); err != nil {
			t.Fatal(err)
		}
		defer bufs[i].Free()
	}
	gm, err := g.NewGEMM()
	if err != nil {
		t.Fatal(err)
	}
	defer gm.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for name, call := range map[string]func() error{
		"Record":      func() error { return e.Record(s) },
		"Wait":        func() error { return s.Wait(e) },
		"GEMM":        func() error { return gm.F32(s, 2, 2, 2, bufs[0], bufs[1], bufs[2]) },
		"Copy":        func() error { return g.Copy(s, bufs[0], bufs[1]) },
		"Synchronize": func() error { return s.Synchronize(ctx) },
	} {
		if err := call(); !errors.Is(err, device.ErrStreamClosed) {
			t.Errorf("%s on a closed stream: %v, want ErrStreamClosed", name, err)
		}
	}
	if err := s.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
}
