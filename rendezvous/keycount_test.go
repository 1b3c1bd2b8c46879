package rendezvous

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestWaitManyKeys: a frame carries at most MaxCallKeys keys and
// maxKeyListBytes of them; a Wait or Check on more (by count, or by bytes:
// a barrier of many ranks whose keys carry a long run id) goes as several
// frames within one deadline. (A count past 16 bits was sent cut: the
// store read a malformed frame and hung up; a key list past its bytes was
// refused.) An error names a few of the keys, not all of them.
func TestWaitManyKeys(t *testing.T) {
	_, dial := start(t)
	c := dial()
	if err := c.Set(ctxT(t, 5*time.Second), "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	many := make([]string, 1<<16+1)
	for i := range many {
		many[i] = "k"
	}
	if err := c.Wait(ctxT(t, 30*time.Second), many...); err != nil {
		t.Errorf("wait on %d keys: %v", len(many), err)
	}
	if ok, err := c.Check(ctxT(t, 30*time.Second), many...); !ok || err != nil {
		t.Errorf("check on %d keys: %v %v", len(many), ok, err)
	}
	// 2600 keys of 4000 bytes: 10 MB, more than a frame carries.
	long := make([]string, 2600)
	for i := range long {
		long[i] = strings.Repeat("x", 3990) + strconv.Itoa(1_000_000+i)
		if err := c.Set(ctxT(t, 5*time.Second), long[i], nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Wait(ctxT(t, 30*time.Second), long...); err != nil {
		t.Errorf("wait on %d keys of %d bytes: %v", len(long), len(long[0]), err)
	}
	if ok, err := c.Check(ctxT(t, 30*time.Second), append(long, "missing")...); ok || err != nil {
		t.Errorf("check with one key missing: %v %v, want false", ok, err)
	}
	err := c.Wait(ctxT(t, 300*time.Millisecond), append(long, "missing")...)
	if !errors.Is(err, ErrTimeout) || len(err.Error()) > 64<<10 || !strings.Contains(err.Error(), "more]") {
		t.Errorf("wait with one key missing: %d bytes of error (%.200s…), want ErrTimeout naming a few keys", len(err.Error()), err)
	}
	if err := c.Barrier(ctxT(t, 5*time.Second), "b", 0, MaxCallKeys+1); !errors.Is(err, ErrBadRequest) {
		t.Errorf("barrier of %d members: %v, want ErrBadRequest", MaxCallKeys+1, err)
	}
	if err := c.Set(ctxT(t, 5*time.Second), "k", []byte("v")); err != nil {
		t.Fatalf("set after: %v", err)
	}
}

// TestCancelledBeforeSending: a call whose context is already cancelled
// sends nothing and keeps the connection for the next call (it gave the
// connection up as if cancelled mid-call).
func TestCancelledBeforeSending(t *testing.T) {
	_, dial := start(t)
	c := dial()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Set(ctx, "k", []byte("v")); !errors.Is(err, context.Canceled) {
		t.Fatalf("set with a cancelled context: %v, want context.Canceled", err)
	}
	if err := c.Set(ctxT(t, 5*time.Second), "k", []byte("v")); err != nil {
		t.Fatalf("set after a cancelled one: %v", err)
	}
}

// TestAddOverflow: an Add past the counter's range is refused
// (ErrBadRequest) and leaves it as it was; it wrapped round before.
func TestAddOverflow(t *testing.T) {
	_, dial := start(t)
	c := dial()
	if _, err := c.Add(ctxT(t, 5*time.Second), "n", math.MaxInt64-1); err != nil {
		t.Fatal(err)
	}
	for _, d := range []int64{2, math.MaxInt64} {
		if n, err := c.Add(ctxT(t, 5*time.Second), "n", d); !errors.Is(err, ErrBadRequest) {
			t.Errorf("add %d to %d: %d, %v, want ErrBadRequest", d, int64(math.MaxInt64-1), n, err)
		}
	}
	if n, err := c.Add(ctxT(t, 5*time.Second), "n", 1); err != nil || n != math.MaxInt64 {
		t.Errorf("add 1 after the refusals: %d, %v, want %d", n, err, int64(math.MaxInt64))
	}
	if _, err := c.Add(ctxT(t, 5*time.Second), "m", math.MinInt64); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Add(ctxT(t, 5*time.Second), "m", -1); !errors.Is(err, ErrBadRequest) {
		t.Errorf("add -1 to MinInt64: %d, %v, want ErrBadRequest", n, err)
	}
}

// TestBarrierReportBounded: a barrier of many members that mostly never
// came reports within seconds after its deadline, naming a few of them
// and how many more (it named every one, in an error of 382 KB).
func TestBarrierReportBounded(t *testing.T) {
	_, dial := start(t)
	c := dial()
	start := time.Now()
	err := c.Barrier(ctxT(t, 300*time.Millisecond), "b", 0, 20000)
	var me *MissingError
	if !errors.As(err, &me) || len(err.Error()) > 4<<10 || !strings.Contains(err.Error(), "more never arrived") {
		t.Fatalf("%.300v (%d bytes), want a MissingError naming a few members", err, len(err.Error()))
	}
	if d := time.Since(start); d > 8*time.Second {
		t.Errorf("the report took %v", d)
	}
}
