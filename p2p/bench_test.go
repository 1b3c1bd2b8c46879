package p2p

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/slimego/slimego/internal/machine"
)

// BenchmarkRead and BenchmarkWrite move one region's bytes between two
// endpoints of this process over loopback TCP and over the same-host
// transport (slimebench p2p measures between processes): in one range,
// and 4 MiB as a batch of 64 pages of 64 KiB (the batch's bookkeeping
// beside the same bytes in one range).
func BenchmarkRead(b *testing.B)  { benchOneSided(b, false) }
func BenchmarkWrite(b *testing.B) { benchOneSided(b, true) }

func benchOneSided(b *testing.B, write bool) {
	cases := []struct{ size, batch int }{{8, 1}, {64 << 10, 1}, {4 << 20, 1}, {64 << 10, 64}, {64 << 20, 1}}
	for _, tcpOnly := range []bool{true, false} {
		for _, k := range cases {
			name := map[bool]string{true: "tcp", false: "cma"}[tcpOnly]
			total := k.size * k.batch
			b.Run(fmt.Sprintf("%s/%dx%d", name, k.batch, k.size), func(b *testing.B) {
				ctx, a, c, p := benchPair(b, tcpOnly)
				lr, _ := a.Register("l", make([]byte, total))
				rr, _ := c.Register("r", make([]byte, total))
				var ops []Op
				for i := range k.batch {
					off := i * k.size
					ops = append(ops, Op{Local: lr, LocalOff: off, Remote: rr.Remote(), RemoteOff: off, Len: k.size})
				}
				b.SetBytes(int64(total))
				b.ResetTimer()
				for range b.N {
					var f *Future
					if write {
						f = p.Write(ops)
					} else {
						f = p.Read(ops)
					}
					if err := f.Wait(ctx); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkSameHostCeiling measures what bounds the same-host transport
// of plain memory: process_vm_readv between two buffers of this process,
// a cmaChunk per call as grantCopy makes them, beside a memcpy (Go's
// copy) of the same bytes; with the buffers on Go's heap (4 KiB pages
// unless the kernel's transparent huge pages are "always")
// and in transparent huge pages where the kernel gives them
// (machine.AllocHuge), which the kernel pins a huge page at a time.
func BenchmarkSameHostCeiling(b *testing.B) {
	for _, size := range []int{1 << 20, 4 << 20, 16 << 20, 64 << 20} {
		for _, pages := range []string{"heap", "huge"} {
			src, dst := make([]byte, size), make([]byte, size)
			if pages == "huge" {
				var free1, free2 func() error
				var err error
				if src, free1, err = machine.AllocHuge(size); err != nil {
					b.Fatal(err)
				}
				defer free1()
				if dst, free2, err = machine.AllocHuge(size); err != nil {
					b.Fatal(err)
				}
				defer free2()
			}
			for i := range src {
				src[i] = byte(i)
			}
			copy(dst, src)
			b.Run(fmt.Sprintf("memcpy/%s/%d", pages, size), func(b *testing.B) {
				b.SetBytes(int64(size))
				for range b.N {
					copy(dst, src)
				}
			})
			b.Run(fmt.Sprintf("process_vm/%s/%d", pages, size), func(b *testing.B) {
				b.SetBytes(int64(size))
				pid := unix.Getpid()
				for range b.N {
					for off := 0; off < size; off += cmaChunk {
						n := min(cmaChunk, size-off)
						l := []unix.Iovec{{Base: &dst[off]}}
						l[0].SetLen(n)
						r := []unix.RemoteIovec{{Base: uintptr(unsafe.Pointer(&src[off])), Len: n}}
						if m, err := unix.ProcessVMReadv(pid, l, r, 0); err != nil || m != n {
							b.Fatalf("process_vm_readv: %d of %d bytes, %v", m, n, err)
						}
					}
				}
			})
		}
	}
}

// BenchmarkWriteWithImm writes one region's bytes and an immediate
// between two endpoints of this process over loopback TCP, the target
// taking each immediate in (a batch of one stripe carries its immediate
// in the write's request).
func BenchmarkWriteWithImm(b *testing.B) {
	for _, size := range []int{8, 64 << 10, 4 << 20} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			ctx, a, c, p := benchPair(b, true)
			lr, _ := a.Register("l", make([]byte, size))
			rr, _ := c.Register("r", make([]byte, size))
			ops := []Op{{Local: lr, Remote: rr.Remote(), Len: size}}
			b.SetBytes(int64(size))
			b.ResetTimer()
			for i := range b.N {
				if err := p.WriteWithImm(ops, uint32(i)).Wait(ctx); err != nil {
					b.Fatal(err)
				}
				if im, err := c.Imm(ctx); err != nil || im.Value != uint32(i) {
					b.Fatalf("immediate %+v, %v", im, err)
				}
			}
		})
	}
}

// benchPair is two endpoints of this process, "a" linked to "b" (over TCP
// only, if tcpOnly), closed when the benchmark ends, and a context that
// bounds it.
func benchPair(b *testing.B, tcpOnly bool) (context.Context, *Endpoint, *Endpoint, *Peer) {
	b.Helper()
	// A process's Waits on a peer in the same process park (TestMain
	// lets the tests' read their answers instead).
	waitReadsSelf = false
	b.Cleanup(func() { waitReadsSelf = true })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	b.Cleanup(cancel)
	mk := func(n string) *Endpoint {
		e, err := New(ctx, Options{Name: n, TCPOnly: tcpOnly})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { e.Close() })
		return e
	}
	a, c := mk("a"), mk("b")
	p, err := a.ConnectInfo(ctx, c.Info())
	if err != nil {
		b.Fatal(err)
	}
	return ctx, a, c, p
}

// BenchmarkReadSmallBusy is an 8-byte read over loopback TCP with the
// other processors idle and with each of them kept busy by a spinning
// goroutine: a Wait parked in the network poller (waker) saves the
// spinning thread the runtime wakes for an idle processor, but costs two
// eventfd system calls, which is a loss where no processor is idle.
func BenchmarkReadSmallBusy(b *testing.B) {
	for _, busy := range []bool{false, true} {
		b.Run(map[bool]string{false: "idle", true: "busy"}[busy], func(b *testing.B) {
			ctx, a, c, p := benchPair(b, true)
			lr, _ := a.Register("l", make([]byte, 8))
			rr, _ := c.Register("r", make([]byte, 8))
			ops := []Op{{Local: lr, Remote: rr.Remote(), Len: 8}}
			stop := make(chan struct{})
			if busy {
				for range runtime.GOMAXPROCS(0) - 1 {
					go func() {
						for {
							select {
							case <-stop:
								return
							default:
							}
						}
					}()
				}
			}
			defer close(stop)
			b.ResetTimer()
			for range b.N {
				if err := p.Read(ops).Wait(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRegisterPages registers b.N pages of 4 KiB, each a region of
// its own name, as a KV cache of many pages is (slimebench p2p's
// --register times the same for 1 GiB).
func BenchmarkRegisterPages(b *testing.B) {
	e, err := New(context.Background(), Options{Name: "a", Auth: testAuth()})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	mem := make([]byte, 4096*(b.N+1))
	b.ResetTimer()
	for i := range b.N {
		if _, err := e.Register(fmt.Sprint("page", i), mem[i*4096:(i+1)*4096]); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer() // not Close's withdrawal of them
}
