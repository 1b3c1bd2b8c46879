// Command agcheck is the worker of the multi-process tests: launched by
// slimerun, it runs AllGather in every form on random data and checks each
// result byte for byte, or provokes a fault and checks how every rank
// reports it. It prints "PASS rank R" and exits 0 when all is well; in a
// fault mode, a survivor that saw the expected error exits 3.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/internal/bytesize"
	"github.com/slimego/slimego/internal/pattern"
	"github.com/slimego/slimego/overlap"
)

const exitExpectedFault = 3

func main() {
	sizes := pflag.StringSlice("sizes", []string{"0", "1", "7", "4096", "1048579"}, "per-rank sizes")
	iters := pflag.Int("iters", 2, "iterations of each check")
	planRuns := pflag.Int("plan-runs", 1000, "runs of one plan back to back")
	planSize := pflag.String("plan-size", "4099", "size of the plan check")
	fault := pflag.String("fault", "", "provoke a fault: mismatch, kill, stop, slow, kill-overlap, precancel, closed-plan, cancel-gpu, cancel-wait, init-cancelled, exit-before-init")
	faultRank := pflag.Int("fault-rank", 1, "rank that causes the fault")
	faultSize := pflag.String("fault-size", "64M", "message size while a peer is killed")
	initDelay := pflag.Duration("init-delay", 0, "how long the fault rank waits before Init")
	runID := pflag.String("run-id", "", "Options.RunID: the program's own name for its keys")
	failFirst := pflag.Bool("fail-first-attempt", false, "the fault rank exits 7 before Init in the launcher's first attempt")
	pflag.Parse()

	ctx := context.Background()
	me, _ := strconv.Atoi(os.Getenv("RANK"))
	if me == *faultRank {
		time.Sleep(*initDelay)
		if *fault == "exit-before-init" {
			os.Exit(0) // a rank that leaves cleanly before ever joining
		}
		if rc := os.Getenv("SLIME_RESTART_COUNT"); *failFirst && (rc == "" || rc == "0") {
			os.Exit(7)
		}
	}
	ictx := ctx
	if me == *faultRank && *fault == "init-cancelled" {
		// Init given a context cancelled before the call: the error is
		// the cancellation (context.Canceled), not a timeout.
		var cancel context.CancelFunc
		ictx, cancel = context.WithCancel(ctx)
		cancel()
	}
	c, err := collective.Init(ictx, collective.Options{Job: collective.Job{RunID: *runID}})
	if *fault == "init-cancelled" && me == *faultRank {
		if err == nil || errors.Is(err, collective.ErrTimeout) || !errors.Is(err, context.Canceled) {
			fmt.Printf("UNEXPECTED rank %d: Init with a cancelled context: %v\n", me, err)
			os.Exit(1)
		}
		fmt.Printf("EXPECTED rank %d: %v\n", me, err)
		os.Exit(exitExpectedFault)
	}
	if err != nil {
		if *fault == "exit-before-init" {
			var oe *collective.OpError
			if errors.Is(err, collective.ErrPeerLost) && errors.As(err, &oe) && oe.Peer == *faultRank {
				fmt.Printf("EXPECTED rank %d: %v\n", me, err)
				os.Exit(exitExpectedFault)
			}
			fmt.Printf("UNEXPECTED rank %d: %v\n", me, err)
		}
		fmt.Fprintln(os.Stderr, "init:", err)
		os.Exit(1)
	}
	defer c.Close()
	if *fault != "" {
		// Closed before the exit, as a program that handles the error
		// would: where this rank hosts the store, the others still
		// reach it (for a failed peer's account, inter.Explain).
		code := runFault(ctx, c, *fault, *faultRank, mustSize(*faultSize))
		c.Close()
		os.Exit(code)
	}
	var ns []int
	for _, s := range *sizes {
		ns = append(ns, mustSize(s))
	}
	for _, check := range []func() error{
		func() error { return checkAll(ctx, c, ns, *iters) },
		func() error { return checkV(ctx, c, ns, *iters) },
		func() error { return checkPlan(ctx, c, mustSize(*planSize), *planRuns) },
		func() error { return checkTyped(ctx, c) },
		func() error { return checkBadInput(ctx, c) },
	} {
		if err := check(); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL rank %d: %v\n", c.Rank(), err)
			os.Exit(1)
		}
	}
	if err := c.Barrier(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "final barrier:", err)
		os.Exit(1)
	}
	fmt.Printf("PASS rank %d\n", c.Rank())
}

func mustSize(s string) int {
	n, err := bytesize.Parse(s)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	return int(n)
}

// verify checks every block of dst against the pattern its rank sent.
func verify(dst []byte, counts []int, iter int, what string) error {
	off := 0
	for r, n := range counts {
		if i := pattern.Check(dst[off:off+n], pattern.Seed(r, iter, uint64(n))); i >= 0 {
			return fmt.Errorf("%s: byte %d of rank %d's %d-byte block is wrong", what, i, r, n)
		}
		off += n
	}
	return nil
}

func equal(p, n int) []int {
	c := make([]int, p)
	for i := range c {
		c[i] = n
	}
	return c
}

// checkAll: AllGather out of place and in place, on plain and symmetric
// buffers.
func checkAll(ctx context.Context, c *collective.Communicator, sizes []int, iters int) error {
	P, me := c.Size(), c.Rank()
	for _, n := range sizes {
		counts := equal(P, n)
		symSrc, err := c.Alloc(ctx, n)
		if err != nil {
			return err
		}
		symDst, err := c.Alloc(ctx, P*n)
		if err != nil {
			return err
		}
		plainDst := make([]byte, P*n)
		plainSrc := make([]byte, n)
		cases := []struct {
			name     string
			dst, src []byte
		}{
			{"plain out-of-place", plainDst, plainSrc},
			{"plain in-place", plainDst, plainDst[me*n : me*n+n]},
			{"symmetric out-of-place", plainDst, symSrc.Bytes()},
			{"symmetric in-place", symDst.Bytes(), symDst.Bytes()[me*n : me*n+n]},
		}
		for _, tc := range cases {
			for it := range iters {
				pattern.Fill(tc.dst, uint64(it)+7) // stale bytes must be overwritten
				pattern.Fill(tc.src, pattern.Seed(me, it, uint64(n)))
				if err := c.AllGather(ctx, tc.dst, tc.src); err != nil {
					return fmt.Errorf("%s, %d bytes: %w", tc.name, n, err)
				}
				if err := verify(tc.dst, counts, it, fmt.Sprintf("%s, %d bytes, iteration %d", tc.name, n, it)); err != nil {
					return err
				}
			}
		}
		symSrc.Free()
		symDst.Free()
		fmt.Printf("ok allgather %d bytes\n", n)
	}
	return nil
}

// checkV: uneven counts, some of them zero.
func checkV(ctx context.Context, c *collective.Communicator, sizes []int, iters int) error {
	P, me := c.Size(), c.Rank()
	for _, n := range sizes {
		counts := make([]int, P)
		total := 0
		for r := range counts {
			counts[r] = (n*(r+1))/P + r%3 // uneven; rank 0 may get 0
			if r == P-1 && P > 1 {
				counts[r] = 0
			}
			total += counts[r]
		}
		dst := make([]byte, total+5)
		src := make([]byte, counts[me])
		for it := range iters {
			pattern.Fill(src, pattern.Seed(me, it, uint64(counts[me])))
			if err := c.AllGatherV(ctx, dst, src, counts); err != nil {
				return fmt.Errorf("allgatherv %v: %w", counts, err)
			}
			if err := verify(dst, counts, it, fmt.Sprintf("allgatherv %v", counts)); err != nil {
				return err
			}
		}
	}
	fmt.Println("ok allgatherv")
	return nil
}

// checkPlan: one plan, many runs back to back, the data changing each time.
func checkPlan(ctx context.Context, c *collective.Communicator, n, runs int) error {
	P, me := c.Size(), c.Rank()
	dst, src := make([]byte, P*n), make([]byte, n)
	plan, err := c.Plan(dst, src)
	if err != nil {
		return err
	}
	counts := equal(P, n)
	for it := range runs {
		pattern.Fill(src, pattern.Seed(me, it, uint64(n)))
		if err := plan.Run(ctx); err != nil {
			return fmt.Errorf("plan run %d: %w", it, err)
		}
		if err := verify(dst, counts, it, fmt.Sprintf("plan run %d", it)); err != nil {
			return err
		}
	}
	fmt.Printf("ok plan %d runs of %d bytes\n", runs, n)
	return nil
}

func checkTyped(ctx context.Context, c *collective.Communicator) error {
	P, me := c.Size(), c.Rank()
	src := []float32{float32(me) + 0.5, float32(me) * -3, 1e-7 * float32(me+1)}
	dst := make([]float32, P*len(src))
	if err := collective.AllGatherOf(ctx, c, dst, src); err != nil {
		return err
	}
	for r := range P {
		want := []float32{float32(r) + 0.5, float32(r) * -3, 1e-7 * float32(r+1)}
		for i, w := range want {
			if dst[r*3+i] != w {
				return fmt.Errorf("typed: dst[%d] = %v, want %v", r*3+i, dst[r*3+i], w)
			}
		}
	}
	fmt.Println("ok typed")
	return nil
}

// checkBadInput: errors that concern this rank alone leave the
// communicator usable.
func checkBadInput(ctx context.Context, c *collective.Communicator) error {
	err := c.AllGather(ctx, make([]byte, c.Size()*8-1), make([]byte, 8))
	if !errors.Is(err, collective.ErrInvalid) {
		return fmt.Errorf("short destination: got %v, want ErrInvalid", err)
	}
	fmt.Printf("ok bad input: %v\n", err)
	return c.Barrier(ctx)
}

// runFault provokes one fault and reports what this rank observed.
func runFault(ctx context.Context, c *collective.Communicator, kind string, who, n int) int {
	P, me := c.Size(), c.Rank()
	report := func(err error, want ...error) int {
		for _, w := range want {
			if errors.Is(err, w) {
				fmt.Printf("EXPECTED rank %d: %v\n", me, err)
				return exitExpectedFault
			}
		}
		fmt.Printf("UNEXPECTED rank %d: %v\n", me, err)
		return 1
	}
	switch kind {
	case "mismatch":
		m := n
		if me == who {
			m++
		}
		err := c.AllGather(ctx, make([]byte, P*(m+1)), make([]byte, m))
		if code := report(err, collective.ErrSizeMismatch); code != exitExpectedFault {
			return code
		}
		// The communicator is still usable.
		if err := c.AllGather(ctx, make([]byte, P*8), make([]byte, 8)); err != nil {
			fmt.Printf("UNEXPECTED rank %d after mismatch: %v\n", me, err)
			return 1
		}
		return exitExpectedFault
	case "kill", "slow", "stop":
		dst, src := make([]byte, P*n), make([]byte, n)
		pattern.Fill(src, uint64(me))
		// With --fault-rank -1 no rank stops itself: the test kills a node.
		if me == who {
			if kind == "kill" {
				go func() {
					time.Sleep(150 * time.Millisecond)
					syscall.Kill(os.Getpid(), syscall.SIGKILL)
				}()
			} else if kind == "stop" {
				// Stopped mid-call, continued once the peers gave up.
				cont := exec.Command("/bin/sh", "-c", fmt.Sprintf("sleep 0.15; kill -STOP %d; sleep %.3f; kill -CONT %d",
					os.Getpid(), (2*c.Timeout()).Seconds(), os.Getpid()))
				if err := cont.Start(); err != nil {
					fmt.Printf("UNEXPECTED rank %d: %v\n", me, err)
					return 1
				}
				defer cont.Wait()
			} else {
				time.Sleep(2 * c.Timeout()) // arrives after the peers gave up
			}
		}
		start := time.Now()
		for {
			if err := c.AllGather(ctx, dst, src); err != nil {
				code := report(err, collective.ErrPeerLost, collective.ErrTimeout)
				fmt.Printf("rank %d noticed after %v\n", me, time.Since(start).Round(time.Millisecond))
				if !strings.Contains(err.Error(), "allgather") {
					return 1
				}
				return code
			}
		}
	case "precancel":
		// The fault rank's call is given a context cancelled before the
		// call, and comes after the others are waiting for it: the call
		// must fail on every rank (on the fault rank with
		// context.Canceled, on the others naming it), not find every
		// peer's block ready and succeed.
		if err := c.Barrier(ctx); err != nil {
			fmt.Printf("UNEXPECTED rank %d: %v\n", me, err)
			return 1
		}
		dst, src := make([]byte, P*n), make([]byte, n)
		cctx := ctx
		if me == who {
			time.Sleep(300 * time.Millisecond)
			var cancel context.CancelFunc
			cctx, cancel = context.WithCancel(ctx)
			cancel()
		}
		err := c.AllGather(cctx, dst, src)
		if me == who {
			if err == nil {
				fmt.Printf("UNEXPECTED rank %d: a call with a cancelled context succeeded\n", me)
				return 1
			}
			return report(err, context.Canceled)
		}
		var oe *collective.OpError
		if err == nil || !errors.As(err, &oe) || oe.Peer != who {
			fmt.Printf("UNEXPECTED rank %d: %v (want an error naming rank %d)\n", me, err, who)
			return 1
		}
		return report(err, collective.ErrPeerLost)
	case "closed-plan":
		// Every rank runs a plan of byte slices; the fault rank closes
		// its plan first. A closed plan's Run is ErrPlanClosed (and
		// ErrClosed) on that rank
		// (as a plan of device.Buffer values is), and takes part so that
		// the others learn of it at once and the ranks stay in step.
		dst, src := make([]byte, P*n), make([]byte, n)
		p, err := c.Plan(dst, src)
		if err != nil {
			fmt.Printf("UNEXPECTED rank %d: %v\n", me, err)
			return 1
		}
		if err := p.Run(ctx); err != nil {
			fmt.Printf("UNEXPECTED rank %d: %v\n", me, err)
			return 1
		}
		if me == who {
			if err := p.Close(); err != nil {
				fmt.Printf("UNEXPECTED rank %d: Close: %v\n", me, err)
				return 1
			}
		}
		err = p.Run(ctx)
		want := collective.ErrPlanClosed
		if me == who && !errors.Is(err, collective.ErrClosed) {
			fmt.Printf("UNEXPECTED rank %d: %v (want ErrPlanClosed, which is ErrClosed too)\n", me, err)
			return 1
		}
		var oe *collective.OpError
		if me != who {
			want = collective.ErrInvalid
			if err == nil || !errors.As(err, &oe) || oe.Peer != who {
				fmt.Printf("UNEXPECTED rank %d: %v (want an error naming rank %d)\n", me, err, who)
				return 1
			}
		}
		if code := report(err, want); code != exitExpectedFault {
			return code
		}
		// Still usable, and in step: a gather checked byte for byte.
		pattern.Fill(src, pattern.Seed(me, 9, uint64(n)))
		if err := c.AllGather(ctx, dst, src); err != nil {
			fmt.Printf("UNEXPECTED rank %d after the closed plan: %v\n", me, err)
			return 1
		}
		if err := verify(dst, equal(P, n), 9, "after the closed plan"); err != nil {
			fmt.Printf("UNEXPECTED rank %d: %v\n", me, err)
			return 1
		}
		return exitExpectedFault
	case "cancel-gpu":
		// A plan of the backend's memory (run with SLIME_BACKEND=cuda:
		// GPU memory) checked byte for byte, then run by the fault rank
		// with a context cancelled before the call: its wait for the GPU
		// gives up, and that is the context's cancellation
		// (context.Canceled), not a timeout.
		dev := c.Device()
		dstB, err := dev.NewBuffer(P * n)
		if err != nil {
			fmt.Printf("UNEXPECTED rank %d: %v\n", me, err)
			return 1
		}
		srcB, err := dev.NewBuffer(n)
		if err != nil {
			fmt.Printf("UNEXPECTED rank %d: %v\n", me, err)
			return 1
		}
		src, dst := make([]byte, n), make([]byte, P*n)
		pattern.Fill(src, pattern.Seed(me, 4, uint64(n)))
		if err := srcB.CopyIn(src); err != nil {
			fmt.Printf("UNEXPECTED rank %d: %v\n", me, err)
			return 1
		}
		p, err := c.PlanBuffers(ctx, dstB, srcB)
		if err == nil {
			err = p.Run(ctx)
		}
		if err == nil {
			err = dstB.CopyOut(dst)
		}
		if err == nil {
			err = verify(dst, equal(P, n), 4, fmt.Sprintf("%s plan", c.Backend()))
		}
		if err != nil {
			fmt.Printf("UNEXPECTED rank %d: %v\n", me, err)
			return 1
		}
		if me != who {
			// The fault rank launches nothing: this rank's kernels wait
			// for its block until their timeout, which names it.
			err := p.Run(ctx)
			var oe *collective.OpError
			if !errors.As(err, &oe) || oe.Peer != who {
				fmt.Printf("UNEXPECTED rank %d: %v (want an error naming rank %d)\n", me, err, who)
				return 1
			}
			return report(err, collective.ErrTimeout)
		}
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		err = p.Run(cctx)
		if errors.Is(err, collective.ErrTimeout) {
			fmt.Printf("UNEXPECTED rank %d: a cancelled context reported as a timeout: %v\n", me, err)
			return 1
		}
		return report(err, context.Canceled)
	case "cancel-wait":
		// The fault rank cancels its call while it waits for the others,
		// which come later: the call ends on every rank, the others'
		// naming it.
		if err := c.Barrier(ctx); err != nil {
			fmt.Printf("UNEXPECTED rank %d: %v\n", me, err)
			return 1
		}
		dst, src := make([]byte, P*n), make([]byte, n)
		cctx := ctx
		if me == who {
			var cancel context.CancelFunc
			cctx, cancel = context.WithCancel(ctx)
			defer cancel()
			time.AfterFunc(200*time.Millisecond, cancel)
		} else {
			time.Sleep(time.Second)
		}
		err := c.AllGather(cctx, dst, src)
		var oe *collective.OpError
		if me == who {
			return report(err, context.Canceled)
		}
		if err == nil || !errors.As(err, &oe) || oe.Peer != who {
			fmt.Printf("UNEXPECTED rank %d: %v (want an error naming rank %d)\n", me, err, who)
			return 1
		}
		return report(err, collective.ErrPeerLost)
	case "kill-overlap":
		// A rank dies during overlapped AllGather+GEMM runs.
		o, err := overlap.New[float32](ctx, c, 512, 64, 256, 4)
		if err != nil {
			fmt.Printf("UNEXPECTED rank %d: %v\n", me, err)
			return 1
		}
		defer o.Close()
		if me == who {
			go func() {
				time.Sleep(300 * time.Millisecond)
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}()
		}
		start := time.Now()
		for {
			if err := o.Run(ctx); err != nil {
				fmt.Printf("rank %d noticed after %v\n", me, time.Since(start).Round(time.Millisecond))
				return report(err, collective.ErrPeerLost, collective.ErrTimeout)
			}
		}
	}
	fmt.Fprintf(os.Stderr, "unknown fault %q\n", kind)
	return 2
}
