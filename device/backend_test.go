package device_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"

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

// gemmCase is one product of TestBackendsGEMMViews: its shape, and where
// A's rows start in their buffer (a view at an offset, as an operator
// multiplies some rows of a matrix).
type gemmCase struct{ m, n, k, aRow int }

// refGEMM is the plain triple loop the backends are checked against.
func refGEMM[T float32 | float64](a, b []T, m, n, k int) []T {
	c := make([]T, m*n)
	for i := range m {
		for j := range n {
			var sum T
			for l := range k {
				sum += a[i*k+l] * b[l*n+j]
			}
			c[i*n+j] = sum
		}
	}
	return c
}

func toBytes[T float32 | float64](v []T) []byte {
	var z T
	esz := int(unsafe.Sizeof(z))
	out := make([]byte, esz*len(v))
	for i, x := range v {
		if esz == 4 {
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(float32(x)))
		} else {
			binary.LittleEndian.PutUint64(out[8*i:], math.Float64bits(float64(x)))
		}
	}
	return out
}

// TestBackendsGEMMViews: on each backend, F32 and F64 products of random
// matrices whose operands are views inside larger buffers (A's rows from
// an offset, C written into the middle of a buffer) equal a plain triple
// loop byte for byte (the entries are small integers, exact in either
// type whatever order the BLAS sums in), and leave the bytes around C's
// view as they were; k = 0 writes zeros; a view out of its buffer's
// bounds is an error.
func TestBackendsGEMMViews(t *testing.T) {
	for _, bk := range backends(t) {
		t.Run(bk.name, func(t *testing.T) {
			d := bk.dev(t)
			g, s := gemmAndStream(t, d)
			for _, tc := range []gemmCase{{37, 29, 41, 5}, {1, 1, 1, 0}, {64, 17, 3, 11}, {70, 65, 66, 2}, {9, 8, 0, 3}, {0, 9, 4, 1}, {5, 0, 7, 2}} {
				t.Run(fmt.Sprintf("%dx%dx%d", tc.m, tc.n, tc.k), func(t *testing.T) {
					gemmViews[float32](t, d, g.F32, s, tc, uint64(tc.m*100+tc.k))
					gemmViews[float64](t, d, g.F64, s, tc, uint64(tc.m*100+tc.k+1))
				})
			}
			b, err := d.NewBuffer(64)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Free()
			for _, r := range [][2]int{{-1, 4}, {60, 5}, {0, 65}, {3, -1}} {
				if _, err := b.View(r[0], r[1]); err == nil {
					t.Errorf("View(%d, %d) of 64 bytes: no error", r[0], r[1])
				}
			}
			v, err := b.View(64, 0)
			if err != nil || v.Size() != 0 || v.Kind() != d.Kind() {
				t.Errorf("View(64, 0) of 64 bytes: %v, %v", v, err)
			}
		})
	}
}

func gemmViews[T float32 | float64](t *testing.T, d device.Device, gemm func(device.Stream, int, int, int, device.Buffer, device.Buffer, device.Buffer) error, s device.Stream, tc gemmCase, seed uint64) {
	t.Helper()
	var z T
	esz := int(unsafe.Sizeof(z))
	m, n, k := tc.m, tc.n, tc.k
	rng := rand.New(rand.NewPCG(seed, 3))
	rows := tc.aRow + m + 2 // A's buffer holds rows before and after the view
	A, B := make([]T, rows*k), make([]T, k*n)
	for i := range A {
		A[i] = T(rng.IntN(9) - 4)
	}
	for i := range B {
		B[i] = T(rng.IntN(9) - 4)
	}
	want := toBytes(refGEMM(A[tc.aRow*k:(tc.aRow+m)*k], B, m, n, k))
	alloc := func(src []byte) device.Buffer {
		buf, err := d.NewBuffer(len(src))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { buf.Free() })
		if err := buf.CopyIn(src); err != nil {
			t.Fatal(err)
		}
		return buf
	}
	const guard = 24 // bytes of C's buffer before and after the view
	cInit := make([]byte, guard+len(want)+guard)
	for i := range cInit {
		cInit[i] = byte(rng.IntN(256))
	}
	a, b, c := alloc(toBytes(A)), alloc(toBytes(B)), alloc(cInit)
	av, err := a.View(tc.aRow*k*esz, m*k*esz)
	if err != nil {
		t.Fatal(err)
	}
	cv, err := c.View(guard, len(want))
	if err != nil {
		t.Fatal(err)
	}
	if err := gemm(s, m, n, k, av, b, cv); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Synchronize(ctx); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(cInit))
	if err := c.CopyOut(got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:guard], cInit[:guard]) || !bytes.Equal(got[guard+len(want):], cInit[guard+len(want):]) {
		t.Errorf("%T: the GEMM wrote outside its view of C", z)
	}
	if !bytes.Equal(got[guard:guard+len(want)], want) {
		t.Errorf("%T: C differs from the triple loop", z)
	}
	if err := gemm(s, m+1, n, k, av, b, cv); err == nil {
		t.Errorf("%T: a GEMM larger than its views was enqueued", z)
	}
}

// TestCPUGEMMAllocs: once a CPU GEMM has run, enqueuing a product (a view
// of the operands made beforehand) and waiting for it allocates nothing, so
// that an operator's planned runs stay allocation-free.
func TestCPUGEMMAllocs(t *testing.T) {
	d := device.CPUDevice{}
	g, s := gemmAndStream(t, d)
	const m, n, k = 16, 8, 12
	a, _ := d.NewBuffer(8 * m * k)
	b, _ := d.NewBuffer(8 * k * n)
	c, _ := d.NewBuffer(8 * m * n)
	av, err := a.View(4*k, 4*(m-1)*k)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	allocs := testing.AllocsPerRun(50, func() {
		if err := g.F32(s, m-1, n, k, av, b, c); err != nil {
			t.Fatal(err)
		}
		if err := g.F64(s, m, n, k, a, b, c); err != nil {
			t.Fatal(err)
		}
		if err := s.Synchronize(ctx); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 0 {
		t.Errorf("%.1f allocations per product", allocs)
	}
}

// TestMultiplyHost: the CPU GEMM's product on the calling goroutine equals
// the triple loop byte for byte (small integers), and slices shorter than
// the shape are an error, not a panic.
func TestMultiplyHost(t *testing.T) {
	const m, n, k = 23, 31, 17
	rng := rand.New(rand.NewPCG(1, 2))
	A, B := make([]float64, m*k), make([]float64, k*n)
	for i := range A {
		A[i] = float64(rng.IntN(9) - 4)
	}
	for i := range B {
		B[i] = float64(rng.IntN(9) - 4)
	}
	C := make([]float64, m*n)
	if err := device.MultiplyHost(A, B, C, m, n, k); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(toBytes(C), toBytes(refGEMM(A, B, m, n, k))) {
		t.Error("MultiplyHost differs from the triple loop")
	}
	if err := device.MultiplyHost(A, B, C[:m*n-1], m, n, k); err == nil {
		t.Error("a C one element short: no error")
	}
}

// gemmAndStream makes a GEMM and a stream of d, closed when the test ends.
func gemmAndStream(t *testing.T, d device.Device) (device.GEMM, device.Stream) {
	t.Helper()
	g, err := d.NewGEMM()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return g, s
}
