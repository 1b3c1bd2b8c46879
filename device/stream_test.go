package device

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

func TestStreamOrder(t *testing.T) {
	s := NewCPUStream()
	defer s.Close()
	var got []int
	for i := range 100 {
		s.Launch(func() error { got = append(got, i); return nil })
	}
	if err := s.Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i, v := range got {
		if v != i {
			t.Fatalf("item %d ran as %d", i, v)
		}
	}
}

func TestEventOrdersStreams(t *testing.T) {
	comm, compute := NewCPUStream(), NewCPUStream()
	defer comm.Close()
	defer compute.Close()
	var ready atomic.Bool
	ev := new(CPUEvent)
	comm.Launch(func() error { time.Sleep(30 * time.Millisecond); ready.Store(true); return nil })
	comm.Record(ev)
	compute.Wait(ev)
	var sawReady bool
	compute.Launch(func() error { sawReady = ready.Load(); return nil })
	if err := compute.Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !sawReady {
		t.Fatal("work after Wait ran before the event's work finished")
	}
	if err := ev.Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestErrorPropagates(t *testing.T) {
	comm, compute := NewCPUStream(), NewCPUStream()
	defer comm.Close()
	defer compute.Close()
	boom := errors.New("boom")
	ran := false
	comm.Launch(func() error { return boom })
	comm.Launch(func() error { ran = true; return nil })
	ev := new(CPUEvent)
	comm.Record(ev)
	compute.Wait(ev)
	computed := false
	compute.Launch(func() error { computed = true; return nil })
	if err := compute.Synchronize(context.Background()); !errors.Is(err, boom) {
		t.Fatalf("compute: %v", err)
	}
	if err := comm.Synchronize(context.Background()); !errors.Is(err, boom) {
		t.Fatalf("comm: %v", err)
	}
	if ran || computed {
		t.Fatal("work after a failure ran")
	}
	comm.Reset()
	comm.Launch(func() error { return nil })
	if err := comm.Synchronize(context.Background()); err != nil {
		t.Fatalf("after Reset: %v", err)
	}
}

// TestSynchronizeDeadline: Synchronize of a stream and of an event whose
// work never finishes returns the context's error once the context ends,
// by deadline or by cancellation. Each call runs in a goroutine under a 5 s
// bound, so that a Synchronize that ignores its context fails the test in
// seconds instead of hanging the binary until its timeout.
func TestSynchronizeDeadline(t *testing.T) {
	cases := []struct {
		name  string
		event bool
		want  error
		ctx   func() (context.Context, context.CancelFunc)
	}{
		{"stream/deadline", false, context.DeadlineExceeded, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 30*time.Millisecond)
		}},
		{"stream/cancel", false, context.Canceled, cancelSoon},
		{"event/deadline", true, context.DeadlineExceeded, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 30*time.Millisecond)
		}},
		{"event/cancel", true, context.Canceled, cancelSoon},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := NewCPUStream()
			defer s.Close()
			release := make(chan struct{})
			defer close(release)
			s.Launch(func() error { <-release; return nil })
			ev := new(CPUEvent)
			s.Record(ev)
			ctx, cancel := c.ctx()
			defer cancel()
			got := make(chan error, 1)
			go func() {
				if c.event {
					got <- ev.Synchronize(ctx)
				} else {
					got <- s.Synchronize(ctx)
				}
			}()
			select {
			case err := <-got:
				if !errors.Is(err, c.want) {
					t.Fatalf("err = %v, want %v", err, c.want)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("Synchronize still waits 5 s after its context ended")
			}
		})
	}
}

// cancelSoon is a context cancelled 30 ms from now.
func cancelSoon() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(30*time.Millisecond, cancel)
	return ctx, cancel
}

func TestWaitTimesOut(t *testing.T) {
	comm, compute := NewCPUStream(), NewCPUStream()
	defer comm.Close()
	defer compute.Close()
	compute.WaitTimeout = 50 * time.Millisecond
	release := make(chan struct{})
	defer close(release)
	comm.Launch(func() error { <-release; return nil })
	ev := new(CPUEvent)
	comm.Record(ev)
	compute.Wait(ev)
	if err := compute.Synchronize(context.Background()); !errors.Is(err, ErrWaitTimeout) {
		t.Fatalf("err = %v", err)
	}
}

// TestNoAllocs: once its work is made, a round of launches, a record, a
// wait on another stream and the synchronizations allocate nothing.
func TestNoAllocs(t *testing.T) {
	comm, compute := NewCPUStream(), NewCPUStream()
	defer comm.Close()
	defer compute.Close()
	ev := new(CPUEvent)
	var n int
	work := func() error { n++; return nil }
	ctx := context.Background()
	allocs := testing.AllocsPerRun(100, func() {
		comm.Launch(work)
		comm.Record(ev)
		compute.Wait(ev)
		compute.Launch(work)
		if err := compute.Synchronize(ctx); err != nil {
			t.Fatal(err)
		}
		if err := comm.Synchronize(ctx); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per round", allocs)
	}
	if n != 2*101 {
		t.Fatalf("work ran %d times, want %d", n, 2*101)
	}
}

// TestWaitDeadlinePerWait: each wait has its own deadline, however long
// the stream has run: 100 waits of 5 ms each under a 200 ms timeout (the
// margin a loaded machine's scheduler needs), together longer than it,
// all succeed.
func TestWaitDeadlinePerWait(t *testing.T) {
	comm, compute := NewCPUStream(), NewCPUStream()
	defer comm.Close()
	defer compute.Close()
	compute.WaitTimeout = 200 * time.Millisecond
	ev := new(CPUEvent)
	slow := func() error { time.Sleep(5 * time.Millisecond); return nil }
	for range 100 {
		comm.Launch(slow)
		comm.Record(ev)
		compute.Wait(ev)
	}
	if err := compute.Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestSynchronizeIdleTakesNoLock: a collective's launch on the CPU backend
// asks its stream, every call, whether work is pending; on an idle stream
// that answer must not take the stream's lock (the hot path of a planned
// collective takes none). The lock is held here by the test; an idle
// Synchronize must still return, and a failed stream must still report.
func TestSynchronizeIdleTakesNoLock(t *testing.T) {
	s := NewCPUStream()
	defer s.Close()
	s.Launch(func() error { return nil })
	if err := s.Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	done := make(chan error, 1)
	go func() { done <- s.Synchronize(context.Background()) }()
	select {
	case err := <-done:
		s.mu.Unlock()
		if err != nil {
			t.Fatalf("idle stream: %v", err)
		}
	case <-time.After(5 * time.Second):
		s.mu.Unlock()
		<-done
		t.Fatal("Synchronize of an idle stream waited for the stream's lock")
	}
	boom := errors.New("boom")
	s.Launch(func() error { return boom })
	if err := s.Synchronize(context.Background()); !errors.Is(err, boom) {
		t.Fatalf("failed stream: got %v, want boom", err)
	}
	// Idle again, but failed: the failure is still reported until Reset.
	if err := s.Synchronize(context.Background()); !errors.Is(err, boom) {
		t.Fatalf("failed idle stream: got %v, want boom", err)
	}
	s.Reset()
	if err := s.Synchronize(context.Background()); err != nil {
		t.Fatalf("after Reset: %v", err)
	}
}

// TestSynchronizeBy: a CPU stream's Synchronize with a deadline gives up
// at it (ErrWaitTimeout) while the work runs on, reports ctx's own error
// when ctx ends first, then returns the work's outcome once it is done;
// waiting on busy work that way allocates nothing.
func TestSynchronizeBy(t *testing.T) {
	s := NewCPUStream()
	defer s.Close()
	release := make(chan struct{})
	s.Launch(func() error { <-release; return nil })
	if err := s.SynchronizeBy(context.Background(), time.Now().Add(50*time.Millisecond)); !errors.Is(err, ErrWaitTimeout) {
		t.Fatalf("SynchronizeBy over blocked work: %v, want ErrWaitTimeout", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.SynchronizeBy(ctx, time.Now().Add(time.Hour)); !errors.Is(err, context.Canceled) {
		t.Fatalf("SynchronizeBy with a cancelled context: %v, want context.Canceled", err)
	}
	close(release)
	far := time.Now().Add(time.Minute)
	if err := s.SynchronizeBy(context.Background(), far); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	s.Launch(func() error { time.Sleep(time.Millisecond); return boom })
	if err := s.SynchronizeBy(context.Background(), far); !errors.Is(err, boom) {
		t.Fatalf("SynchronizeBy after failed work: %v, want it", err)
	}
	s.Reset()
	fn := func() error { return nil }
	if a := testing.AllocsPerRun(100, func() {
		s.Launch(fn)
		if err := s.SynchronizeBy(context.Background(), far); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Errorf("Launch and SynchronizeBy: %v allocations", a)
	}
}
