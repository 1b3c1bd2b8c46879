package intra

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/fault"
)

// TestHostileSymmetricHeader: a peer's header lives in shared memory that
// the peer writes, so its symmetric buffer id and offset are not trusted.
// A block announced at an offset near the largest int (where offset plus
// length wraps round) or past the buffer, or in a buffer that does not
// exist, fails the reader's call with ErrSizeMismatch naming the peer: it
// neither panics nor reads outside the buffer. Rank 1 is the peer gone
// bad: it announces such a header and does nothing more.
func TestHostileSymmetricHeader(t *testing.T) {
	const n = 4096
	for _, tc := range []struct {
		name string
		buf  uint32 // id + 1
		off  uint64
	}{
		{"offset that wraps", 1, uint64(math.MaxInt64 - 10)},
		{"offset past the buffer", 1, n + 1},
		{"negative offset", 1, math.MaxUint64 - 100},
		{"no such buffer", 7, 0},
		{"buffer id 0", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Timeout: 2 * time.Second, ZeroCopyMin: 1, CMAMin: -1}
			sizes, offs := []int{n, n}, []int{0, n}
			errs := group(t, 2, cfg, func(g *Group) error {
				ctx := context.Background()
				me := g.Rank()
				b, err := g.Alloc(ctx, n)
				if err != nil {
					return err
				}
				defer b.Free()
				op, err := g.Plan("allgather", make([]byte, 2*n), b.Bytes(), sizes, offs)
				if err != nil {
					return err
				}
				if me == 1 {
					op.mode, op.zcBuf, op.zcOff = modeSymmetric, tc.buf, tc.off
					announce(op)
					time.Sleep(500 * time.Millisecond) // alive while rank 0 reads the header
					return nil
				}
				err = op.Run(ctx)
				var oe *fault.OpError
				if !errors.Is(err, fault.ErrSizeMismatch) || !errors.As(err, &oe) || oe.Peer != 1 {
					return err
				}
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

// TestCMAPidPinned: a peer's control block lives in shared memory that the
// peer writes, so the pid in it is not trusted after Init: a block read
// with process_vm_readv is read from the process whose pid was taken (and
// watched) at Init. Rank 1 is the peer gone bad: it rewrites its pid to
// another process's (a child of the test) before the all-gather; rank 0
// still reads rank 1's block, byte for byte, and from nowhere else.
func TestCMAPidPinned(t *testing.T) {
	other := exec.Command("sleep", "60")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { other.Process.Kill(); other.Wait() }()
	const n = 64 << 10
	sizes, offs := []int{n, n}, []int{0, n}
	want, _ := expectAll(2, sizes, 3)
	errs := group(t, 2, Config{Timeout: 10 * time.Second, CMAMin: 1, ZeroCopyMin: 1 << 30}, func(g *Group) error {
		ctx := context.Background()
		if !g.cma {
			return errSkipCMA
		}
		me := g.Rank()
		src := make([]byte, n)
		fill(src, uint64(me*1000003+3))
		dst := make([]byte, 2*n)
		op, err := g.Plan("allgather", dst, src, sizes, offs)
		if err != nil {
			return err
		}
		if op.mode != modeCMA {
			return fmt.Errorf("mode %d, want process_vm_readv's", op.mode)
		}
		if me == 1 {
			atomic.StoreUint32(&g.ctrls[me].pid, uint32(other.Process.Pid))
		}
		if err := g.Barrier(ctx); err != nil {
			return err
		}
		if err := op.Run(ctx); err != nil {
			return err
		}
		if !bytes.Equal(dst, want) {
			return fmt.Errorf("rank %d: the gathered bytes differ", me)
		}
		return nil
	})
	for r, err := range errs {
		if errors.Is(err, errSkipCMA) {
			t.Skip("process_vm_readv is not allowed here")
		}
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

var errSkipCMA = errors.New("no process_vm_readv")
