package device

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestSynchronizeDoneWithLiveContext: once the work is done, Synchronize
// and an event's Synchronize return at once with a context that has not
// ended, and the stream's error when the work failed; they neither wait for
// the context nor report it.
func TestSynchronizeDoneWithLiveContext(t *testing.T) {
	boom := errors.New("boom")
	for _, fail := range []bool{false, true} {
		s := NewCPUStream()
		s.Launch(func() error { return nil })
		if fail {
			s.Launch(func() error { return boom })
		}
		ev := new(CPUEvent)
		s.Record(ev)
		if err := s.Synchronize(context.Background()); (err != nil) != fail {
			t.Fatalf("fail=%v: %v", fail, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		got := make(chan error, 2)
		go func() {
			got <- s.Synchronize(ctx)
			got <- ev.Synchronize(ctx)
		}()
		for i := range 2 {
			select {
			case err := <-got:
				if fail && !errors.Is(err, boom) || !fail && err != nil {
					t.Fatalf("fail=%v, call %d: %v", fail, i, err)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("fail=%v: Synchronize of finished work waits on its context", fail)
			}
		}
		cancel()
		s.Close()
	}
}

// TestSynchronizeReturnsWhenWorkEnds: a Synchronize that waits, with a
// context that has not ended, returns nil as soon as the work finishes.
func TestSynchronizeReturnsWhenWorkEnds(t *testing.T) {
	s := NewCPUStream()
	defer s.Close()
	release := make(chan struct{})
	s.Launch(func() error { <-release; return nil })
	ev := new(CPUEvent)
	s.Record(ev)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got := make(chan error, 2)
	go func() { got <- s.Synchronize(ctx) }()
	go func() { got <- ev.Synchronize(ctx) }()
	close(release)
	for range 2 {
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Synchronize still waits 5 s after the work finished")
		}
	}
}

// TestSynchronizeDoneAllocatesNothing: waiting for finished work with a
// context that can end allocates nothing (no context.AfterFunc).
func TestSynchronizeDoneAllocatesNothing(t *testing.T) {
	s := NewCPUStream()
	defer s.Close()
	s.Launch(func() error { return nil })
	if err := s.Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if n := testing.AllocsPerRun(100, func() { s.Synchronize(ctx) }); n != 0 {
		t.Errorf("Synchronize of finished work allocates %v times", n)
	}
}
