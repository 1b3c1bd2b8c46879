package intra

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/fault"
)

// TestAllocTooLarge: a symmetric buffer larger than /dev/shm, the memory
// or the cgroup allows is an ErrInvalid error on rank 0 that says so, and
// ErrPeerLost on the others, at once, with nothing left in /dev/shm (group
// checks that).
func TestAllocTooLarge(t *testing.T) {
	start := time.Now()
	errs := group(t, 2, Config{Timeout: 20 * time.Second}, func(g *Group) error {
		_, err := g.Alloc(context.Background(), 1<<50)
		var oe *fault.OpError
		if !errors.As(err, &oe) || oe.Op != "alloc" || oe.Rank != g.Rank() {
			return fmt.Errorf("want an alloc error of rank %d, got %v", g.Rank(), err)
		}
		if g.Rank() == 0 && (!errors.Is(err, fault.ErrInvalid) || !strings.Contains(err.Error(), "not enough shared memory")) {
			return fmt.Errorf("want ErrInvalid for lack of space, got %v", err)
		}
		if g.Rank() == 1 && !errors.Is(err, fault.ErrPeerLost) {
			return fmt.Errorf("want ErrPeerLost, got %v", err)
		}
		t.Logf("rank %d: %v", g.Rank(), err)
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %v", d)
	}
}

// TestNewTooLarge: a group whose rings cannot fit fails at Init, before
// anything is allocated.
func TestNewTooLarge(t *testing.T) {
	errs := group(t, 2, Config{Timeout: 20 * time.Second, SlotBytes: 1 << 40, Slots: 1024}, func(g *Group) error {
		return errors.New("New succeeded")
	})
	if !errors.Is(errs[0], fault.ErrInvalid) || !strings.Contains(errs[0].Error(), "init rank 0") {
		t.Errorf("rank 0: want an init ErrInvalid, got %v", errs[0])
	}
	if !errors.Is(errs[1], fault.ErrPeerLost) {
		t.Errorf("rank 1: want ErrPeerLost, got %v", errs[1])
	}
}

// TestNewSweepsOrphans: Init on local rank 0 removes a segment that a dead
// process left, and keeps one of a live process.
func TestNewSweepsOrphans(t *testing.T) {
	const gonePID = 1<<22 + 1 // above every pid_max Linux allows
	orphan := fmt.Sprintf("slimego-testorphan-%d-seg-o%d.5-0123456789ab", os.Getpid(), gonePID)
	live := fmt.Sprintf("slimego-testlive-%d-seg-o1.0-0123456789ab", os.Getpid()) // pid 1 did not start at tick 0... unless it did
	st, err := os.ReadFile("/proc/1/stat")
	if err == nil {
		f := strings.Fields(string(st[bytes.LastIndexByte(st, ')')+1:]))
		live = fmt.Sprintf("slimego-testlive-%d-seg-o1.%s-0123456789ab", os.Getpid(), f[19])
	}
	for _, n := range []string{orphan, live} {
		p := filepath.Join("/dev/shm", n)
		if err := os.WriteFile(p, []byte("left"), 0o600); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(p) })
	}
	errs := group(t, 2, Config{Timeout: 20 * time.Second}, func(g *Group) error { return g.Barrier(context.Background()) })
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	if _, err := os.Stat(filepath.Join("/dev/shm", orphan)); err == nil {
		t.Errorf("orphan %s not removed", orphan)
	}
	if _, err := os.Stat(filepath.Join("/dev/shm", live)); err != nil {
		t.Errorf("segment %s of a live process removed", live)
	}
}

// TestTimeoutWording: a wait that times out says, in English, how long it
// waited and for what.
func TestTimeoutWording(t *testing.T) {
	done := make(chan struct{})
	errs := group(t, 2, Config{Timeout: 300 * time.Millisecond}, func(g *Group) error {
		if g.Rank() == 0 {
			<-done // alive, but never joins the barrier
			return nil
		}
		defer close(done)
		err := g.Barrier(context.Background())
		if !errors.Is(err, fault.ErrTimeout) {
			return fmt.Errorf("want ErrTimeout, got %v", err)
		}
		if !strings.Contains(err.Error(), "waited 300ms for the header") {
			return fmt.Errorf("message: %v", err)
		}
		t.Log(err)
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// FuzzIdentity: a segment header from a file anyone may have written is
// read without panicking, and accepted only when it is exactly the one
// expected.
func FuzzIdentity(f *testing.F) {
	lay, _ := newLayout(2, DefaultSlots, DefaultSlotBytes)
	job := jobHash("slimego-job-world-")
	good := make([]byte, pageBytes)
	lay.writeIdentity(good, job)
	f.Add(good)
	f.Add(good[:identityBytes-1])
	f.Add([]byte("slimego1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if lay.checkIdentity(b, job) == nil && !bytes.Equal(b[:identityBytes], good[:identityBytes]) {
			if _, err := readIdentity(b); err != nil || !bytes.Equal(b[:28], good[:28]) || !bytes.Equal(b[32:48], good[32:48]) {
				t.Errorf("accepted %x", b[:identityBytes])
			}
		}
	})
}
