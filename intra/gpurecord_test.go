package intra

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/internal/teststore"
	"github.com/slimego/slimego/kernels"
	"github.com/slimego/slimego/rendezvous"
)

// forgeGPURecord is a GPU memory record as a member gone bad writes it:
// pid, device, address, bytes, and no IPC handle.
func forgeGPURecord(pid, dev int, p kernels.Ptr, bytes uint64) []byte {
	rec := make([]byte, gpuRecord)
	binary.LittleEndian.PutUint64(rec, uint64(pid))
	binary.LittleEndian.PutUint64(rec[8:], uint64(dev))
	binary.LittleEndian.PutUint64(rec[16:], uint64(p))
	binary.LittleEndian.PutUint64(rec[24:], bytes)
	return rec
}

// TestGPURecordNotTrusted: a GPU group's region records come from the
// store, which is not trusted. A record that claims this rank's own
// process (its pid) is an address this process uses as it is, so it must
// name an allocation that a rank of this group in this process published,
// on that device and of the region's size: an address anywhere else (one
// the kernels would write into), another group's region included, fails
// NewGPU with ErrInvalid naming the peer.
// A record of a region of another size (a rank given another Cap, whose
// kernels would write past the smaller one) fails it with
// ErrSizeMismatch. Local rank 1 is the member gone bad: it writes its
// record itself and joins the barrier that follows.
func TestGPURecordNotTrusted(t *testing.T) {
	if err := device.CUDAAvailable(); err != nil {
		t.Skipf("skipped: no CUDA library (%v)", err)
	}
	const capBytes = 4096
	want := (&GPUGroup{cfg: GPUConfig{Size: 2}, cap: capBytes}).regionBytes()
	for _, tc := range []struct {
		name string
		rec  func(dev *device.GPU) (rec []byte, free func())
		kind error
	}{
		{"an address anywhere", func(*device.GPU) ([]byte, func()) {
			return forgeGPURecord(os.Getpid(), 0, 0x7f0000001000, want), func() {}
		}, fault.ErrInvalid},
		{"an allocation nobody published", func(dev *device.GPU) ([]byte, func()) {
			m, err := dev.Alloc(int(want))
			if err != nil {
				t.Fatal(err)
			}
			return forgeGPURecord(os.Getpid(), 0, m.Ptr, want), func() { m.Free() }
		}, fault.ErrInvalid},
		{"another group's region", func(dev *device.GPU) ([]byte, func()) {
			m, err := dev.Alloc(int(want))
			if err != nil {
				t.Fatal(err)
			}
			publish(0, m.Ptr, want, "other/gpu/region/0") // as another group of this process would
			return forgeGPURecord(os.Getpid(), 0, m.Ptr, want), func() { unpublish(0, m.Ptr); m.Free() }
		}, fault.ErrInvalid},
		{"a region of another size", func(*device.GPU) ([]byte, func()) {
			return forgeGPURecord(os.Getpid()+1, 0, 0x7f0000001000, want/2), func() {}
		}, fault.ErrSizeMismatch},
		// Another process's record carries an IPC handle besides the
		// size: one that maps a smaller allocation than the record claims
		// (the ranks' kernels would push past its end) is refused.
		{"a handle that maps less", func(*device.GPU) ([]byte, func()) {
			return exportedRecord(t, 4096, want)
		}, fault.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := teststore.Run(t, 2, 20*time.Second, func(ctx context.Context, st *rendezvous.Client, r int) error {
				dev, err := device.OpenGPU(0)
				if err != nil {
					return err
				}
				if r == 1 {
					rec, free := tc.rec(dev)
					defer free()
					if err := st.Set(ctx, "hostile/gpu/region/1", rec); err != nil {
						return err
					}
					// As far as the barrier after the records: a rank that
					// accepted the record gets there.
					bctx, cancel := context.WithTimeout(ctx, 3*time.Second)
					defer cancel()
					st.Barrier(bctx, "hostile/gpu/region/mapped", 1, 2)
					return nil
				}
				g, err := NewGPU(ctx, GPUConfig{Store: st, Key: "hostile", Rank: 0, Size: 2, Dev: dev, Cap: capBytes, Timeout: 5 * time.Second})
				if err == nil {
					cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
					defer cancel()
					g.Close(cctx)
					return errors.New("NewGPU accepted the forged record")
				}
				var oe *fault.OpError
				if !errors.Is(err, tc.kind) || !errors.As(err, &oe) || oe.Peer != 1 {
					return err
				}
				t.Logf("refused: %v", err)
				return nil
			})
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
		})
	}
}

// exportedRecord is a record of want bytes whose IPC handle is that of an
// allocation of n bytes made by a child process (SLIME_INTRA_CHILD_EXPORT,
// alive until free is called).
func exportedRecord(t *testing.T, n int, want uint64) (rec []byte, free func()) {
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), fmt.Sprintf("SLIME_INTRA_CHILD_EXPORT=%d", n))
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	free = func() { stdin.Close(); child.Wait() }
	line, err := bufio.NewReader(out).ReadString('\n')
	h, herr := hex.DecodeString(strings.TrimSpace(line))
	if err != nil || herr != nil || len(h) != kernels.IPCHandleBytes {
		free()
		t.Fatalf("the child's handle: %q (%v, %v)", line, err, herr)
	}
	rec = forgeGPURecord(child.Process.Pid, 0, 0x7f0000001000, want)
	copy(rec[32:], h)
	return rec, free
}
