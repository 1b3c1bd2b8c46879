package launcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// twoNodes starts a job of two nodes of one worker each in this process
// (job runID, a per-process suffix added),
// each worker touching dir/up.<rank> and sleeping 30 s, with restarts
// left, and waits until both workers run. Each node's Run has its own
// context (cancels) and its result comes on its channel; a panic of
// Run comes as a *panicked error.
func twoNodes(t *testing.T, runID, dir string) (cancels [2]context.CancelFunc, ends [2]chan error, outs *[2]syncBuffer) {
	t.Helper()
	port := freeTCPPort(t, "127.0.0.1")
	outs = new([2]syncBuffer)
	for n := range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		t.Cleanup(cancel)
		cancels[n] = cancel
		ends[n] = make(chan error, 1)
		go func() {
			defer func() {
				if r := recover(); r != nil {
					ends[n] <- &panicked{r}
				}
			}()
			ends[n] <- Run(ctx, Config{NNodes: 2, NodeRank: n, NProcPerNode: 1, MasterAddr: "127.0.0.1", MasterPort: port,
				RunID: runID + strconv.Itoa(os.Getpid()), JobSecret: []byte("nodeend-secret"), StopGrace: time.Second, MaxRestarts: 2,
				Program: "sh", Args: []string{"-c", "touch " + dir + "/up.$RANK.$TORCHELASTIC_RESTART_COUNT; exec sleep 30"},
				Stdout: &outs[n], Stderr: &outs[n]})
		}()
	}
	t.Cleanup(func() {
		for n := range 2 {
			cancels[n]()
			select {
			case <-ends[n]:
			case <-time.After(30 * time.Second):
				t.Errorf("node %d did not end", n)
			}
		}
	})
	if !appears(dir+"/up.0.0") || !appears(dir+"/up.1.0") {
		t.Fatalf("the workers did not start:\n%s\n%s", outs[0].String(), outs[1].String())
	}
	time.Sleep(200 * time.Millisecond) // the failure watches are on
	if m, _ := filepath.Glob(dir + "/up.*.[1-9]"); len(m) > 0 {
		t.Fatalf("workers restarted: %v", m)
	}
	return cancels, ends, outs
}

// appears waits (20 s at most) for path to exist and says whether it does.
func appears(path string) bool {
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return true
		}
	}
	return false
}

type panicked struct{ v any }

func (p *panicked) Error() string { return fmt.Sprintf("panic: %v", p.v) }

// endsWith waits (15 s at most) for the node's Run to return and checks
// that it stopped for the other node: a *RemoteError naming it, with the
// flag that keeps it from restarting its workers and the reason's words.
func endsWith(t *testing.T, ends [2]chan error, outs *[2]syncBuffer, node int, flag func(*RemoteError) bool, words string) {
	t.Helper()
	t0 := time.Now()
	select {
	case err := <-ends[node]:
		re, ok := errors.AsType[*RemoteError](err)
		if !ok || !flag(re) || !strings.Contains(err.Error(), words) {
			t.Errorf("node %d, after %v: %v; want a RemoteError saying %q (%+v)\n%s", node, time.Since(t0).Round(time.Millisecond), err, words, re, outs[node].String())
		}
		ends[node] <- err // for the cleanup
	case <-time.After(15 * time.Second):
		t.Errorf("node %d still runs 15 s after the other ended:\n%s", node, outs[node].String())
	}
}

// TestCancelledNodeStopsOthers: a node whose Run's context is cancelled
// (a program that runs the launcher as a library and stops it) stops
// the job on the other node too, as a signal to its slimerun does: the
// other node stops its workers at once, does not restart them, and says
// that node was interrupted. Before, node 0 took node 1's workers'
// SIGTERM for a failure and restarted into a rendezvous node 1 never
// joined, and node 1 took a cancelled node 0 for a dead one.
func TestCancelledNodeStopsOthers(t *testing.T) {
	for _, cancelled := range []int{1, 0} {
		t.Run(fmt.Sprintf("node%d", cancelled), func(t *testing.T) {
			cancels, ends, outs := twoNodes(t, fmt.Sprintf("cancel%d-", cancelled), t.TempDir())
			cancels[cancelled]()
			endsWith(t, ends, outs, 1-cancelled, func(re *RemoteError) bool { return re.Interrupted && re.Node == cancelled },
				fmt.Sprintf("node %d was interrupted", cancelled))
		})
	}
}

// TestPanicInRunTellsOtherNodes: a panic in node 1's Run is no clean
// end: its guard stops node 1's workers and tells node 0, which stops
// its own and does not restart them. Before, the deferred close of the
// guard's pipe said "a clean end" during the panic too, and node 0's
// worker ran to its own end.
func TestPanicInRunTellsOtherNodes(t *testing.T) {
	dir := t.TempDir()
	testHookStarted = func(node, attempt int) {
		if node != 1 {
			return
		}
		appears(dir + "/up.0.0")
		appears(dir + "/up.1.0")
		time.Sleep(300 * time.Millisecond) // twoNodes has seen both
		panic("a bug in the launcher")
	}
	t.Cleanup(func() { testHookStarted = nil })
	_, ends, outs := twoNodes(t, "panic-", dir)
	select {
	case err := <-ends[1]:
		if _, ok := errors.AsType[*panicked](err); !ok {
			t.Fatalf("node 1: %v, want its panic", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("node 1's Run did not panic")
	}
	ends[1] <- nil
	endsWith(t, ends, outs, 0, func(re *RemoteError) bool { return re.Lost && re.Node == 1 }, "node 1's launcher (pid "+strconv.Itoa(os.Getpid())+") died")
}
