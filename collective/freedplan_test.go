package collective_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/internal/pattern"
)

// TestPlanOverFreedBuffer: a Plan whose source or destination lies in a
// symmetric buffer that a rank has freed since is refused on that rank
// with ErrInvalid, and on every other rank with ErrInvalid naming it, at
// once; it does not fault on unmapped memory, and the communicator stays
// usable. Sizes below and above the zero-copy threshold; the source
// freed on every rank, or only the destination on rank 1.
func TestPlanOverFreedBuffer(t *testing.T) {
	for _, n := range []int{512, 64 << 10} {
		for _, which := range []string{"source on every rank", "destination on rank 1"} {
			t.Run(fmt.Sprintf("%d/%s", n, which), func(t *testing.T) {
				inProcess(t, 3, func(c *collective.Communicator) error {
					ctx := context.Background()
					sb, err := c.Alloc(ctx, n)
					if err != nil {
						return err
					}
					db, err := c.Alloc(ctx, 3*n)
					if err != nil {
						return err
					}
					p, err := c.Plan(db.Bytes(), sb.Bytes())
					if err != nil {
						return err
					}
					if err := p.Run(ctx); err != nil {
						return err
					}
					culprit := which == "source on every rank" || c.Rank() == 1
					if which == "source on every rank" {
						sb.Free()
					} else if c.Rank() == 1 {
						db.Free()
					}
					start := time.Now()
					err = p.Run(ctx)
					var oe *collective.OpError
					if !errors.Is(err, collective.ErrInvalid) || !errors.As(err, &oe) || oe.Op != "allgather" || oe.Rank != c.Rank() ||
						!culprit && (oe.Peer != 1 || !strings.Contains(err.Error(), "freed")) {
						return fmt.Errorf("a run over a freed buffer: %v, want ErrInvalid (naming rank 1 on the others)", err)
					}
					if took := time.Since(start); took > 5*time.Second {
						return fmt.Errorf("the refusal took %v", took)
					}
					src, dst := make([]byte, n), make([]byte, 3*n)
					pattern.Fill(src, pattern.Seed(c.Rank(), 1, 0))
					if err := c.AllGather(ctx, dst, src); err != nil {
						return fmt.Errorf("the gather after the refusal: %w", err)
					}
					for r := range 3 {
						if i := pattern.Check(dst[r*n:r*n+n], pattern.Seed(r, 1, 0)); i >= 0 {
							return fmt.Errorf("the gather after the refusal: rank %d's block wrong at %d", r, i)
						}
					}
					return nil
				})
			})
		}
	}
}

// TestFreeDuringCall: Free of a symmetric buffer while another
// goroutine's gather from it is in progress is refused (ErrInvalid) and
// unmaps nothing; the gather then completes with the right data.
func TestFreeDuringCall(t *testing.T) {
	const n = 64 << 10
	go1 := make(chan struct{}) // rank 1 may call
	inProcess(t, 2, func(c *collective.Communicator) error {
		ctx := context.Background()
		b, err := c.Alloc(ctx, n)
		if err != nil {
			return err
		}
		src := b.Bytes()
		pattern.Fill(src, pattern.Seed(c.Rank(), 0, 0))
		dst := make([]byte, 2*n)
		want := make([]byte, 2*n)
		pattern.Fill(want[:n], pattern.Seed(0, 0, 0))
		pattern.Fill(want[n:], pattern.Seed(1, 0, 0))
		if c.Rank() == 1 {
			<-go1
			if err := c.AllGather(ctx, dst, src); err != nil {
				return err
			}
			if !bytes.Equal(dst, want) {
				return errors.New("rank 1: wrong data")
			}
			return b.Free()
		}
		first := make(chan error, 1)
		go func() { first <- c.AllGather(ctx, dst, src) }() // waits for rank 1
		// Free only once the gather is in its call (however late its
		// goroutine runs): before it, Free would succeed and unmap the
		// buffer that rank 1 then reads.
		for dl := time.Now().Add(10 * time.Second); !collective.InCall(c); time.Sleep(time.Millisecond) {
			if time.Now().After(dl) {
				close(go1)
				<-first
				return errors.New("the gather's goroutine did not enter its call within 10 s")
			}
		}
		err = b.Free()
		close(go1)
		if !errors.Is(err, collective.ErrInvalid) || b.Bytes() == nil {
			<-first
			return fmt.Errorf("Free during another goroutine's gather from the buffer: %v, mapped %v; want ErrInvalid, still mapped", err, b.Bytes() != nil)
		}
		if err := <-first; err != nil {
			return fmt.Errorf("the gather: %w", err)
		}
		if !bytes.Equal(dst, want) {
			return errors.New("rank 0: wrong data")
		}
		return b.Free()
	})
}

// TestGPUPlanOverFreedBuffer: a plan of device memory whose source or
// destination every rank has freed since (the buffer itself, or the
// allocation a view of it lies in) is refused with ErrInvalid by Run and
// Launch, and a new plan over it by PlanBuffers, graph and eager mode
// alike: its graph is not replayed, nor its
// kernel launched, over memory that is no longer the plan's (the emulator
// crashed the process; a GPU would fault or write into whatever was
// allocated there since). The communicator stays usable.
func TestGPUPlanOverFreedBuffer(t *testing.T) {
	needGPU(t)
	const n = 1000
	for _, eager := range []bool{false, true} {
		for _, which := range []string{"source", "destination under an in-place source"} {
			t.Run(fmt.Sprintf("eager=%v/%s", eager, which), func(t *testing.T) {
				gpuRanks(t, 2, eager, 0, func(c *collective.Communicator) error {
					ctx := context.Background()
					gpu := gpuOf(c)
					dst, err := gpu.Alloc(2 * n)
					if err != nil {
						return err
					}
					defer dst.Free()
					src, err := dst.Slice(c.Rank()*n, n) // a view: dst's Free frees it
					if err != nil {
						return err
					}
					if which == "source" {
						if src, err = gpu.Alloc(n); err != nil {
							return err
						}
					}
					p, err := c.PlanBuffers(ctx, dst, src)
					if err != nil {
						return err
					}
					defer p.Close()
					if err := p.Run(ctx); err != nil {
						return err
					}
					if which == "source" {
						src.Free()
					} else {
						dst.Free()
					}
					for name, call := range map[string]func(context.Context) error{"Run": p.Run, "Launch": p.Launch} {
						if err := call(ctx); !errors.Is(err, collective.ErrInvalid) || !strings.Contains(err.Error(), "freed") {
							return fmt.Errorf("%s over a freed buffer: %v, want ErrInvalid saying it was freed", name, err)
						}
					}
					if p3, err := c.PlanBuffers(ctx, dst, src); !errors.Is(err, collective.ErrInvalid) {
						if p3 != nil {
							p3.Close()
						}
						return fmt.Errorf("a plan over the freed buffer: %v, want ErrInvalid", err)
					}
					d2, s2, err := rankBlocksGPU(c, 100)
					if err != nil {
						return err
					}
					defer d2.Free()
					p2, err := c.PlanBuffers(ctx, d2, s2)
					if err != nil {
						return fmt.Errorf("a plan after the refusal: %w", err)
					}
					defer p2.Close()
					if err := p2.Run(ctx); err != nil {
						return fmt.Errorf("a run after the refusal: %w", err)
					}
					return checkRankBlocks(d2, 100)
				})
			})
		}
	}
}

// TestPlanOverFreedBufferAcrossNodes: as TestPlanOverFreedBuffer, on 2
// nodes of 2 ranks (the hierarchical engine) and 2 nodes of 1 (the ring),
// the destination freed on rank 1: the run is refused, not a fault.
func TestPlanOverFreedBufferAcrossNodes(t *testing.T) {
	const n = 512
	for _, shape := range [][2]int{{2, 2}, {2, 1}} {
		t.Run(fmt.Sprintf("%dx%d", shape[0], shape[1]), func(t *testing.T) {
			P := shape[0] * shape[1]
			inProcessNodes(t, shape[0], shape[1], nil, func(c *collective.Communicator) error {
				ctx := context.Background()
				db, err := c.Alloc(ctx, P*n)
				if err != nil {
					return err
				}
				src := make([]byte, n)
				p, err := c.Plan(db.Bytes(), src)
				if err != nil {
					return err
				}
				if err := p.Run(ctx); err != nil {
					return err
				}
				if c.Rank() == 1 {
					if err := db.Free(); err != nil {
						return err
					}
				}
				if err := p.Run(ctx); !errors.Is(err, collective.ErrInvalid) {
					return fmt.Errorf("a run over a freed destination: %v, want ErrInvalid", err)
				}
				dst := make([]byte, P*n)
				pattern.Fill(src, pattern.Seed(c.Rank(), 1, 0))
				if err := c.AllGather(ctx, dst, src); err != nil {
					return fmt.Errorf("the gather after the refusal: %w", err)
				}
				for r := range P {
					if i := pattern.Check(dst[r*n:r*n+n], pattern.Seed(r, 1, 0)); i >= 0 {
						return fmt.Errorf("the gather after the refusal: rank %d's block wrong at %d", r, i)
					}
				}
				return nil
			})
		})
	}
}
