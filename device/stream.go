package device

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

var (
	// ErrStreamClosed is returned for work given to a closed stream.
	ErrStreamClosed = errors.New("device: stream closed")
	// ErrWaitTimeout: work queued behind Wait gave up on its event.
	ErrWaitTimeout = errors.New("device: wait for event timed out")
)

// CPUStream is an ordered queue of work, as a CUDA stream is: work runs in
// the order it was enqueued, each item after the previous one finished.
// On the CPU backend one goroutine runs a stream's work. After an item
// fails, the stream skips the rest and Synchronize reports the error.
type CPUStream struct {
	// WaitTimeout bounds how long work queued behind Wait waits for its
	// event (default 10 minutes): a stream never waits forever.
	WaitTimeout time.Duration

	q    chan item
	mu   sync.Mutex
	cond *sync.Cond
	// queued and done are written under mu; Synchronize reads them
	// without it to find an idle stream (a collective's launch asks
	// every call, and takes no lock there). failed is err != nil, for
	// the same reader.
	queued atomic.Uint64 // items enqueued
	done   atomic.Uint64 // items finished (or skipped)
	failed atomic.Bool
	err    error // first failure
	closed bool

	// The wait the stream's goroutine is in (Wait): the stream it waits on
	// and the timer that wakes it at its deadline, made once.
	waitSrc atomic.Pointer[CPUStream]
	timer   *time.Timer
}

// item is one piece of a stream's work: fn, or, when src is set, a wait
// until src has finished target items.
type item struct {
	fn     func() error
	src    *CPUStream
	target uint64
}

// NewStream starts a stream.
func NewCPUStream() *CPUStream {
	s := &CPUStream{q: make(chan item, 1024)}
	s.cond = sync.NewCond(&s.mu)
	s.timer = time.AfterFunc(time.Hour, s.wake)
	s.timer.Stop()
	go s.run()
	return s
}

func (s *CPUStream) run() {
	for it := range s.q {
		s.mu.Lock()
		failed := s.err != nil
		s.mu.Unlock()
		var err error
		switch {
		case failed:
		case it.src != nil:
			err = s.wait(it.src, it.target)
		default:
			err = it.fn()
		}
		s.mu.Lock()
		if err != nil && s.err == nil {
			s.err = err
			s.failed.Store(true)
		}
		s.done.Add(1)
		s.cond.Broadcast()
		s.mu.Unlock()
	}
	s.timer.Stop()
}

// Launch enqueues fn. fn should be made once and launched many times: the
// stream itself allocates nothing per item.
func (s *CPUStream) Launch(fn func() error) {
	s.enqueue(item{fn: fn})
}

func (s *CPUStream) enqueue(it item) {
	s.mu.Lock()
	if s.closed {
		if s.err == nil {
			s.err = ErrStreamClosed
			s.failed.Store(true)
		}
		s.mu.Unlock()
		return
	}
	s.queued.Add(1)
	s.mu.Unlock()
	s.q <- it
}

// Record marks e as reached once the work enqueued so far is done.
func (s *CPUStream) Record(e *CPUEvent) {
	s.mu.Lock()
	target := s.queued.Load()
	s.mu.Unlock()
	e.mu.Lock()
	e.stream, e.target = s, target
	e.mu.Unlock()
}

// WaitEvent makes the work enqueued after it wait until e is reached; if
// the stream e was recorded on failed, this stream fails with the same
// error. It allocates nothing. (Wait is the same behind the Stream
// interface.)
func (s *CPUStream) WaitEvent(e *CPUEvent) {
	e.mu.Lock()
	src, target := e.stream, e.target
	e.mu.Unlock()
	if src == nil || src == s {
		return // nothing recorded, or ordered already
	}
	s.enqueue(item{src: src, target: target})
}

// wait runs in s's goroutine: it blocks until src has finished n items,
// src fails, or s.WaitTimeout passes.
func (s *CPUStream) wait(src *CPUStream, n uint64) error {
	timeout := s.WaitTimeout
	if timeout <= 0 {
		timeout = 10 * time.Minute
	}
	deadline := time.Now().Add(timeout)
	s.waitSrc.Store(src)
	s.timer.Reset(timeout)
	defer s.timer.Stop()
	src.mu.Lock()
	defer src.mu.Unlock()
	for src.done.Load() < n && src.err == nil {
		if !time.Now().Before(deadline) {
			return fmt.Errorf("%w: an event was not reached within %v", ErrWaitTimeout, timeout)
		}
		src.cond.Wait()
	}
	return src.err
}

// wake is the wait timer's: it wakes the stream the wait is on, whose
// waiters look at the clock again (a late call from an earlier wait only
// wakes them once more).
func (s *CPUStream) wake() {
	if src := s.waitSrc.Load(); src != nil {
		src.mu.Lock()
		src.cond.Broadcast()
		src.mu.Unlock()
	}
}

// waitFor blocks until n items are done, returning the stream's error. It
// allocates nothing when ctx cannot be cancelled or the items are done.
func (s *CPUStream) waitFor(ctx context.Context, n uint64) error {
	s.mu.Lock()
	if s.done.Load() >= n || s.err != nil || ctx.Done() == nil {
		defer s.mu.Unlock()
		for s.done.Load() < n && s.err == nil {
			s.cond.Wait()
		}
		return s.err
	}
	s.mu.Unlock()
	stop := context.AfterFunc(ctx, func() {
		s.mu.Lock()
		s.cond.Broadcast()
		s.mu.Unlock()
	})
	defer stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.done.Load() < n && s.err == nil && ctx.Err() == nil {
		s.cond.Wait()
	}
	if s.err != nil {
		return s.err
	}
	return ctx.Err()
}

// Synchronize waits until all work enqueued so far is done and returns the
// stream's first error, if any; the error stays until Reset.
func (s *CPUStream) Synchronize(ctx context.Context) error {
	if s.Idle() {
		return nil // no lock
	}
	s.mu.Lock()
	n := s.queued.Load()
	s.mu.Unlock()
	return s.waitFor(ctx, n)
}

// SynchronizeBy is Synchronize that also gives up at deadline (unless it
// is zero), with an error wrapping ErrWaitTimeout (ctx's error when ctx
// ends first): a bound per call that needs no context of its own, as
// CUDAStream's. An idle stream answers at once, without a lock; a busy
// one is polled (its counters are atomic), spinning briefly, then
// yielding, then sleeping, so that the wait allocates nothing.
func (s *CPUStream) SynchronizeBy(ctx context.Context, deadline time.Time) error {
	if s.Idle() {
		return nil // no lock
	}
	if deadline.IsZero() {
		return s.Synchronize(ctx)
	}
	s.mu.Lock()
	n := s.queued.Load()
	s.mu.Unlock()
	start := time.Now()
	for i := 0; s.done.Load() < n && !s.failed.Load(); i++ {
		if i&63 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			if !time.Now().Before(deadline) {
				return fmt.Errorf("%w: the stream's work was not done after %v", ErrWaitTimeout, time.Since(start).Round(time.Millisecond))
			}
		}
		pause(start)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Reset clears a failure once the caller has dealt with it.
func (s *CPUStream) Reset() {
	s.mu.Lock()
	s.err = nil
	s.failed.Store(false)
	s.mu.Unlock()
}

// Close ends the stream's goroutine after the enqueued work. It returns
// nil: the error is there for the Stream interface.
func (s *CPUStream) Close() error {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.q)
	}
	s.mu.Unlock()
	return nil
}

// CPUEvent marks a point in a stream's work, for another stream to wait on.
type CPUEvent struct {
	mu     sync.Mutex
	stream *CPUStream
	target uint64
}

// Synchronize waits until the event is reached.
func (e *CPUEvent) Synchronize(ctx context.Context) error {
	e.mu.Lock()
	src, target := e.stream, e.target
	e.mu.Unlock()
	if src == nil {
		return nil
	}
	return src.waitFor(ctx, target)
}

// pause waits a little between two polls of work that began at start:
// not at all for the first 20 µs (short work answers fast), then a yield
// of the processor until 1 ms, then sleeps of 50 µs (long work leaves the
// processor to others).
func pause(start time.Time) {
	switch el := time.Since(start); {
	case el < 20*time.Microsecond:
	case el < time.Millisecond:
		runtime.Gosched()
	default:
		time.Sleep(50 * time.Microsecond)
	}
}

// Idle says, without a lock, that all the work enqueued so far is done and
// none failed: a caller that asks on every call can skip computing a
// deadline for a wait it will not make.
func (s *CPUStream) Idle() bool {
	return s.done.Load() == s.queued.Load() && !s.failed.Load()
}
