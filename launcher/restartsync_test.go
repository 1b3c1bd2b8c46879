package launcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestRestartWaitsForOtherNodes: a job across two nodes restarts after a
// worker of node 1 fails, while node 0's worker takes its time to stop
// (a SIGTERM handler that saves a checkpoint for 2 s). Node 1's next
// attempt must not start before node 0's last worker of the attempt
// before has exited: a worker started early meets the old attempt's
// workers (torch's store on MASTER_PORT, still served by the stopping
// rank 0) and waits for good. Each attempt's workers get a MASTER_PORT
// of their own for the same reason.
func TestRestartWaitsForOtherNodes(t *testing.T) {
	dir := t.TempDir()
	runID := "restartsync-" + strconv.Itoa(os.Getpid())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Every worker records when it started and (rank 0 of attempt 0)
	// when it ended, in nanoseconds, and its MASTER_PORT.
	stamp := `date +%s%N > ` + dir + `/$1.$RANK.$SLIME_RESTART_COUNT; echo $MASTER_PORT > ` + dir + `/port.$RANK.$SLIME_RESTART_COUNT`
	script := `set -- start; ` + stamp + `
if [ "$SLIME_RESTART_COUNT" = 0 ]; then
	if [ "$RANK" = 1 ]; then sleep 0.3; exit 7; fi
	trap 'sleep 2; set -- end; ` + stamp + `; exit 0' TERM
	while :; do sleep 0.05; done
fi`
	var outs [2]syncBuffer
	chs := startTwoNodes(ctx, t, runID, script, &outs, func(n int, c *Config) context.Context {
		c.StopGrace, c.MaxRestarts = 10*time.Second, 1
		return nil
	})
	for n, ch := range chs {
		if err := result(ch, "node "+strconv.Itoa(n)); err != nil {
			t.Fatalf("node %d: %v\n%s", n, err, outs[n].String())
		}
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	ns := func(name string) int64 {
		v, err := strconv.ParseInt(read(name), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	end0, start1 := ns("end.0.0"), ns("start.1.1")
	t.Logf("rank 0 of attempt 0 ended %v before rank 1 of attempt 1 started", time.Duration(start1-end0))
	if start1 < end0 {
		t.Errorf("rank 1 of attempt 1 started %v before rank 0 of attempt 0 had ended", time.Duration(end0-start1))
	}
	for r := range 2 {
		if read("port.0.1") != read("port."+strconv.Itoa(r)+".1") {
			t.Errorf("attempt 1: ranks 0 and %d got MASTER_PORT %s and %s", r, read("port.0.1"), read("port."+strconv.Itoa(r)+".1"))
		}
	}
	if read("port.0.0") == read("port.0.1") {
		t.Errorf("attempts 0 and 1 got the same MASTER_PORT %s", read("port.0.0"))
	}

}

// TestStopWhileWaitingToRestart: a node stopped while it waits for the
// other nodes to restart (its Run's context cancelled, as a signal) ends
// at once with ErrInterrupted and tells them: the other node, once its
// worker has stopped, ends too, saying why, and does not restart again.
// (The stopped node had come to the restart: the other may pass it and
// start its workers, which the stopped node's abort of the attempt then
// stops, as it stops a running attempt.)
func TestStopWhileWaitingToRestart(t *testing.T) {
	dir := t.TempDir()
	runID := "restartstop-" + strconv.Itoa(os.Getpid())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	script := `touch ` + dir + `/start.$RANK.$SLIME_RESTART_COUNT
if [ "$RANK" = 1 ]; then sleep 0.3; exit 7; fi
trap 'sleep 2; exit 0' TERM
while :; do sleep 0.05; done`
	var outs [2]syncBuffer
	ctx1, cancel1 := context.WithCancel(ctx)
	defer cancel1()
	chs := startTwoNodes(ctx, t, runID, script, &outs, func(n int, c *Config) context.Context {
		c.StopGrace, c.MaxRestarts = 10*time.Second, 1
		c.Logf = func(f string, a ...any) { fmt.Fprintf(&outs[n], f+"\n", a...) }
		if n == 1 {
			return ctx1
		}
		return nil
	})
	for !strings.Contains(outs[1].String(), "restarting the workers") {
		if ctx.Err() != nil {
			t.Fatalf("node 1 never restarted:\n%s", outs[1].String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	cancel1()
	err1 := result(chs[1], "node 1")
	took1 := time.Since(start)
	err0 := result(chs[0], "node 0")
	t.Logf("node 1 (%v after its cancel): %v\nnode 0: %v", took1.Round(time.Millisecond), err1, err0)
	if _, ok := errors.AsType[*ErrInterrupted](err1); !ok || took1 > 2*time.Second {
		t.Errorf("node 1 cancelled while it waited to restart: %v after %v; want ErrInterrupted at once", err1, took1)
	}
	if err0 == nil || !strings.Contains(err0.Error(), "node 1 was interrupted") {
		t.Errorf("node 0: %v; want it to say node 1 was interrupted\n%s", err0, outs[0].String())
	}
	if _, err := os.Stat(filepath.Join(dir, "start.1.1")); err == nil {
		t.Errorf("rank 1 of attempt 1 started on the node that was stopped")
	}
	if took := time.Since(start); took > 6*time.Second {
		t.Errorf("node 0 ended %v after node 1 was stopped (its worker takes 2 s to stop)", took.Round(time.Millisecond))
	}
}

// TestNoRestartAfterNode0Ended: node 0's workers all exit 0 and it ends;
// a worker of node 1 fails later. Node 1 must not wait at the restart for
// a node that has ended (a new connection to its store is refused, the
// old one closes after its grace): it ends at once, saying node 0 ended,
// and starts no worker again.
func TestNoRestartAfterNode0Ended(t *testing.T) {
	dir := t.TempDir()
	runID := "restartend-" + strconv.Itoa(os.Getpid())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	script := `touch ` + dir + `/start.$RANK.$SLIME_RESTART_COUNT; if [ "$RANK" = 1 ]; then sleep 1; exit 7; fi`
	var outs [2]syncBuffer
	chs := startTwoNodes(ctx, t, runID, script, &outs, func(n int, c *Config) context.Context {
		c.MaxRestarts = 1
		return nil
	})
	start := time.Now()
	err0 := result(chs[0], "node 0")
	err1 := result(chs[1], "node 1")
	took := time.Since(start)
	t.Logf("node 0: %v\nnode 1 (%v): %v", err0, took.Round(time.Millisecond), err1)
	if err0 != nil {
		t.Errorf("node 0: %v", err0)
	}
	if err1 == nil || !strings.Contains(err1.Error(), "node 0") || took > 8*time.Second {
		t.Errorf("node 1 after %v: %v; want it to end at once, naming node 0's end", took.Round(time.Millisecond), err1)
	}
	if _, err := os.Stat(filepath.Join(dir, "start.1.1")); err == nil {
		t.Errorf("node 1 restarted its worker alone")
	}
}

// TestSignalAsNodesMeet: a signal that comes as the nodes pass the
// restart's barrier is not lost: the node that got it ends with
// ErrInterrupted, and the other does not run its next attempt to the end.
func TestSignalAsNodesMeet(t *testing.T) {
	runID := "restartsig-" + strconv.Itoa(os.Getpid())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Attempt 0: rank 0 fails (the hook below takes node 0's signal
	// channel as its attempt ends). Attempt 1: both run for 20 s.
	script := `if [ "$SLIME_RESTART_COUNT" = 0 ] && [ "$RANK" = 0 ]; then sleep 0.3; exit 7; fi; exec sleep 20`
	var outs [2]syncBuffer
	var sigs0 chan<- os.Signal
	var once sync.Once
	caught := make(chan struct{})
	betweenAttempts = func(node int, s chan<- os.Signal) {
		if node == 0 { // node 1's attempt may end first
			once.Do(func() { sigs0 = s; close(caught) })
		}
	}
	defer func() { betweenAttempts = nil }()
	chs := startTwoNodes(ctx, t, runID, script, &outs, func(n int, c *Config) context.Context {
		c.MaxRestarts = 1
		if n == 0 {
			// The signal comes as node 0's launcher says the nodes met.
			c.Logf = func(f string, a ...any) {
				if strings.HasPrefix(f, "node %d: every node has stopped its workers") {
					<-caught
					sigs0 <- syscall.SIGTERM
				}
			}
		}
		return nil
	})
	start := time.Now()
	err0 := result(chs[0], "node 0")
	err1 := result(chs[1], "node 1")
	t.Logf("node 0: %v\nnode 1: %v", err0, err1)
	if _, ok := errors.AsType[*ErrInterrupted](err0); !ok {
		t.Errorf("node 0, signalled as the nodes met: %v; want ErrInterrupted", err0)
	}
	if err1 == nil || time.Since(start) > 15*time.Second {
		t.Errorf("node 1: %v after %v; want it stopped", err1, time.Since(start))
	}
}
