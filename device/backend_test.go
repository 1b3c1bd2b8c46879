package device_test

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/kernels"
)

// backends is every implementation of the device interfaces: the CPU one
// and the CUDA one (the emulator under make test, which delays every
// operation at random so that a missing Wait shows up as stale data).
func backends(t *testing.T) []struct {
	name string
	dev  func(t *testing.T) device.Device
} {
	return []struct {
		name string
		dev  func(t *testing.T) device.Device
	}{
		{"cpu", func(*testing.T) device.Device { return device.CPUDevice{} }},
		{"cuda", func(t *testing.T) device.Device { return openGPU(t) }},
	}
}

func f32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// TestBackendsOrderAndGEMM runs one scenario through the interfaces on
// each backend: a GEMM on stream one, an event recorded after it, stream
// two waiting on the event and copying the product, the host synchronizing
// stream two with a deadline; the copy must equal a reference product (on
// the emulator a Wait that did not order the copy after the GEMM reads a
// zero or partial product). Mixing backends is ErrMixedBackends.
func TestBackendsOrderAndGEMM(t *testing.T) {
	for _, bk := range backends(t) {
		t.Run(bk.name, func(t *testing.T) {
			d := bk.dev(t)
			const m, n, k = 37, 29, 41 // odd sizes
			rng := rand.New(rand.NewPCG(7, 9))
			A, B := make([]float32, m*k), make([]float32, k*n)
			for i := range A {
				A[i] = float32(rng.IntN(7) - 3)
			}
			for i := range B {
				B[i] = float32(rng.IntN(7) - 3)
			}
			want := make([]float32, m*n) // small integers: exact in float32
			for i := range m {
				for j := range n {
					for l := range k {
						want[i*n+j] += A[i*k+l] * B[l*n+j]
					}
				}
			}
			buf := func(size int) device.Buffer {
				b, err := d.NewBuffer(size)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { b.Free() })
				if b.Kind() != d.Kind() || b.Size() != size || b.Symmetric() {
					t.Fatalf("buffer: kind %v size %d symmetric %v", b.Kind(), b.Size(), b.Symmetric())
				}
				return b
			}
			a, b, c, out := buf(4*m*k), buf(4*k*n), buf(4*m*n), buf(4*m*n)
			if err := a.CopyIn(f32Bytes(A)); err != nil {
				t.Fatal(err)
			}
			if err := b.CopyIn(f32Bytes(B)); err != nil {
				t.Fatal(err)
			}
			if err := out.CopyIn(make([]byte, 4*m*n)); err != nil {
				t.Fatal(err)
			}
			s1, err := d.NewStream()
			if err != nil {
				t.Fatal(err)
			}
			defer s1.Close()
			s2, err := d.NewStream()
			if err != nil {
				t.Fatal(err)
			}
			defer s2.Close()
			ev, err := d.NewEvent()
			if err != nil {
				t.Fatal(err)
			}
			g, err := d.NewGEMM()
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			for round := range 3 {
				if err := g.F32(s1, m, n, k, a, b, c); err != nil {
					t.Fatal(err)
				}
				if err := ev.Record(s1); err != nil {
					t.Fatal(err)
				}
				if err := s2.Wait(ev); err != nil {
					t.Fatal(err)
				}
				if err := d.Copy(s2, out, c); err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				err := s2.Synchronize(ctx)
				cancel()
				if err != nil {
					t.Fatal(err)
				}
				got := make([]byte, 4*m*n)
				if err := out.CopyOut(got); err != nil {
					t.Fatal(err)
				}
				for i, w := range want {
					if g := math.Float32frombits(binary.LittleEndian.Uint32(got[4*i:])); g != w {
						t.Fatalf("round %d: C[%d] = %v, want %v", round, i, g, w)
					}
				}
				if err := ev.Synchronize(context.Background()); err != nil {
					t.Fatal(err)
				}
				// Next round: clear c and out on the host, ordered after
				// both streams' work.
				if err := s1.Synchronize(context.Background()); err != nil {
					t.Fatal(err)
				}
				c.CopyIn(make([]byte, 4*m*n))
				out.CopyIn(make([]byte, 4*m*n))
			}
			// Mixed backends are refused by name.
			other := device.Device(device.CPUDevice{})
			if d.Kind() == device.CPU {
				other = openGPU(t)
			}
			os, err := other.NewStream()
			if err != nil {
				t.Fatal(err)
			}
			defer os.Close()
			if err := ev.Record(os); !errors.Is(err, device.ErrMixedBackends) {
				t.Errorf("event recorded on the other backend's stream: %v", err)
			}
			if err := g.F32(os, m, n, k, a, b, c); !errors.Is(err, device.ErrMixedBackends) {
				t.Errorf("GEMM on the other backend's stream: %v", err)
			}
			if err := g.F32(s1, m+1, n, k, a, b, c); err == nil {
				t.Error("a GEMM larger than its buffers was enqueued")
			}
		})
	}
}

// TestBackendsSynchronizeDeadline: on each backend, a stream whose work
// cannot finish soon makes Synchronize return ErrWaitTimeout at its
// context's deadline instead of waiting for the work. On the CPU the work
// waits on a gate; on CUDA it is the node barrier kernel of a group of two
// whose other rank never comes (it gives up only after its own 3 s).
func TestBackendsSynchronizeDeadline(t *testing.T) {
	t.Run("cpu", func(t *testing.T) {
		s := device.NewCPUStream()
		defer s.Close()
		gate := make(chan struct{})
		s.Launch(func() error { <-gate; return nil })
		defer close(gate)
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := device.Stream(s).Synchronize(ctx)
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, device.ErrWaitTimeout) {
			t.Fatalf("Synchronize with blocked work: %v after %v", err, time.Since(start))
		}
	})
	t.Run("cuda", func(t *testing.T) {
		g := openGPU(t)
		lib := g.Lib()
		s, err := g.NewStream()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		mem, err := g.Alloc(4096)
		if err != nil {
			t.Fatal(err)
		}
		defer mem.Free()
		if err := mem.CopyIn(make([]byte, 4096)); err != nil {
			t.Fatal(err)
		}
		status, statusD, err := lib.HostAlloc(g.Ordinal, 64)
		if err != nil {
			t.Fatal(err)
		}
		a := &kernels.BarrierArgs{Rank: 0, NRanks: 2, Epoch: mem.Ptr + 2048, Status: statusD, TimeoutNS: uint64(3 * time.Second)}
		a.Flags[0], a.Flags[1] = mem.Ptr, mem.Ptr+1024
		if err := lib.Barrier(g.Ordinal, a, s.(*device.CUDAStream).H); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		err = s.Synchronize(ctx)
		if !errors.Is(err, device.ErrWaitTimeout) || time.Since(start) > 2*time.Second {
			t.Errorf("Synchronize of a kernel waiting for a rank that never comes: %v after %v, want ErrWaitTimeout at the 100 ms deadline", err, time.Since(start))
		}
		// Let the kernel give up before its memory goes.
		if err := s.Synchronize(context.Background()); err != nil {
			t.Fatal(err)
		}
		lib.HostFree(g.Ordinal, status)
	})
}
