package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestKilledLauncherStopsOtherNodes: one node's slimerun killed with
// SIGKILL once the workers run (it can tell nobody) ends the job on the
// other node too, within seconds, naming the dead launcher, with or
// without restarts left. Node 1's guard, which kills its workers, tells
// the store; node 0 serves the store, and node 1 finds it lost before
// node 0 said its workers ended. Before, the other node's worker ran on
// to its own end and that node exited 0: half of the job was gone and
// the job was reported a success.
func TestKilledLauncherStopsOtherNodes(t *testing.T) {
	for _, killed := range []int{1, 0} {
		for _, restarts := range []string{"0", "3"} {
			t.Run(fmt.Sprintf("node%d/max-restarts=%s", killed, restarts), func(t *testing.T) { killedLauncherStopsOtherNodes(t, killed, restarts) })
		}
	}
}

func killedLauncherStopsOtherNodes(t *testing.T, killed int, restarts string) {
	dir := t.TempDir()
	cmds, outs, dones := twoSleepingNodes(t, "killed-node", restarts, dir)
	t0 := time.Now()
	cmds[killed].Process.Signal(syscall.SIGKILL)
	other := 1 - killed
	code, ok := exited(dones[other], 15*time.Second)
	if !ok {
		t.Fatalf("node %d still runs %v after node %d's launcher was killed:\n%s\nnode %d:\n%s", other, time.Since(t0).Round(time.Millisecond), killed, text(outs[other]), killed, text(outs[killed]))
	}
	if code != 1 {
		t.Errorf("node %d: exit %d, want 1:\n%s", other, code, text(outs[other]))
	}
	want := "node 1's launcher (pid " + strconv.Itoa(cmds[1].Process.Pid) + ") died"
	if killed == 0 {
		want = "node 0's launcher died"
	}
	if !strings.Contains(text(outs[other]), want) {
		t.Errorf("node %d does not say %q:\n%s\nnode %d:\n%s", other, want, text(outs[other]), killed, text(outs[killed]))
	}
	if m, _ := filepath.Glob(dir + "/up.*.[1-9]"); len(m) > 0 || strings.Contains(text(outs[other]), "restarting") {
		t.Errorf("workers were restarted after node %d's launcher died (%v):\n%s", killed, m, text(outs[other]))
	}
}

// TestNodesEndApart: node 0's worker ends at once, node 1's 12 s later,
// after node 0's store has outlived its workers by its grace (10 s) and
// gone: both launchers exit 0, and node 1 takes the store going away
// after node 0 said its workers ended for no failure.
func TestNodesEndApart(t *testing.T) {
	port := freePortString(t)
	var outs [2]*os.File
	var dones [2]chan error
	for n := range 2 {
		_, outs[n], dones[n] = startSlimerun(t, "apart", "--nnodes", "2", "--node-rank", strconv.Itoa(n), "--nproc-per-node", "1",
			"--master-addr", "127.0.0.1", "--master-port", port,
			"sh", "-c", "sleep $((RANK * 12))")
	}
	for n := range 2 {
		code, ok := exited(dones[n], 40*time.Second)
		if !ok || code != 0 {
			t.Errorf("node %d: exit %d (ended %v), want 0:\n%s", n, code, ok, text(outs[n]))
		}
		if n == 0 {
			select {
			case <-dones[1]:
				t.Fatal("node 1 ended before node 0 (and its store): the test saw no store go away")
			default:
			}
		}
	}
	if strings.Contains(text(outs[1]), "died") {
		t.Errorf("node 1 reports a death:\n%s", text(outs[1]))
	}
}

// TestKilledLauncherDuringRestart: rank 0 fails its first attempt and
// node 0 comes to the restart, where it waits for node 1, whose grace
// runs for a worker that ignores SIGTERM. Node 1's launcher killed then
// is told to node 0's wait (its guard aborts the attempts after the one
// it knew), which ends at once, naming it, rather than wait out its
// bound or run on. With a short grace both nodes restart; node 0's
// launcher killed then, node 1's next attempt ends, naming node 0.
func TestKilledLauncherDuringRestart(t *testing.T) {
	for _, k := range []struct {
		killed int
		grace  string
	}{{1, "20s"}, {0, "2s"}} {
		t.Run(fmt.Sprintf("node%d", k.killed), func(t *testing.T) {
			dir := t.TempDir()
			port := freePortString(t)
			script := fmt.Sprintf(`touch %s/up.$RANK.$TORCHELASTIC_RESTART_COUNT
if [ $RANK = 0 ] && [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then exit 1; fi
if [ $RANK = 1 ]; then trap '' TERM; fi
exec sleep 60`, dir)
			var cmds [2]*exec.Cmd
			var outs [2]*os.File
			var dones [2]chan error
			for n := range 2 {
				cmds[n], outs[n], dones[n] = startSlimerun(t, "restart-kill", "--nnodes", "2", "--node-rank", strconv.Itoa(n), "--nproc-per-node", "1",
					"--master-addr", "127.0.0.1", "--master-port", port, "--stop-grace", k.grace, "--max-restarts", "1",
					"sh", "-c", script)
			}
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				// Node 1 killed: once node 0 waits at the restart. Node
				// 0 killed: once its next attempt runs.
				if k.killed == 1 && strings.Contains(text(outs[0]), "restarting the workers") {
					break
				}
				if _, err := os.Stat(dir + "/up.0.1"); err == nil && k.killed == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("node 0 did not restart:\n%s\n%s", text(outs[0]), text(outs[1]))
				}
			}
			time.Sleep(300 * time.Millisecond) // its wait, or failure watch, is on
			t0 := time.Now()
			cmds[k.killed].Process.Signal(syscall.SIGKILL)
			other := 1 - k.killed
			code, ok := exited(dones[other], 20*time.Second)
			if !ok {
				t.Fatalf("node %d still runs %v after node %d's launcher was killed:\n%s\nnode %d:\n%s", other, time.Since(t0).Round(time.Millisecond), k.killed, text(outs[other]), k.killed, text(outs[k.killed]))
			}
			want := fmt.Sprintf("node %d's launcher ", k.killed)
			if code != 1 || !strings.Contains(text(outs[other]), want) {
				t.Errorf("node %d: exit %d, want 1 saying %q:\n%s", other, code, want, text(outs[other]))
			}
		})
	}
}

// TestKilledLauncherLongSecret: a job secret of 40000 bytes (its hex
// longer than a scanner's default line) still reaches node 1's guard,
// which tells node 0 of node 1's death.
func TestKilledLauncherLongSecret(t *testing.T) {
	dir := t.TempDir()
	cmds, outs, dones := twoSleepingNodes(t, strings.Repeat("s", 40000), "0", dir)
	cmds[1].Process.Signal(syscall.SIGKILL)
	code, ok := exited(dones[0], 15*time.Second)
	if !ok || code != 1 || !strings.Contains(text(outs[0]), "node 1's launcher (pid ") {
		t.Fatalf("node 0: exit %d (ended %v), want 1 naming node 1's launcher:\n%s", code, ok, text(outs[0]))
	}
}

// TestNodeEndsWhileOtherStops: rank 0 fails its first attempt, and node
// 1 waits, its grace of 12 s running, for a worker that ignores SIGTERM.
// Node 0 waits for it at the restart (a new worker must not meet an old
// one still stopping), then both nodes' next attempts run and succeed:
// both exit 0, and nobody is reported dead.
func TestNodeEndsWhileOtherStops(t *testing.T) {
	dir := t.TempDir()
	port := freePortString(t)
	script := fmt.Sprintf(`touch %s/up.$RANK.$TORCHELASTIC_RESTART_COUNT
[ $TORCHELASTIC_RESTART_COUNT = 1 ] && exit 0
[ $RANK = 0 ] && exit 1
trap '' TERM
exec sleep 60`, dir)
	var outs [2]*os.File
	var dones [2]chan error
	for n := range 2 {
		_, outs[n], dones[n] = startSlimerun(t, "ends-apart", "--nnodes", "2", "--node-rank", strconv.Itoa(n), "--nproc-per-node", "1",
			"--master-addr", "127.0.0.1", "--master-port", port, "--stop-grace", "12s", "--max-restarts", "1",
			"sh", "-c", script)
	}
	for n := range 2 {
		code, ok := exited(dones[n], 40*time.Second)
		if !ok || code != 0 {
			t.Errorf("node %d: exit %d (ended %v), want 0:\n%s", n, code, ok, text(outs[n]))
		}
	}
	if _, err := os.Stat(dir + "/up.1.1"); err != nil {
		t.Errorf("node 1 did not run its next attempt: %v\n%s", err, text(outs[1]))
	}
	if strings.Contains(text(outs[1]), "died") {
		t.Errorf("node 1 reports a death:\n%s", text(outs[1]))
	}
}

// TestKilledJobSparesTheNext: both launchers of a job killed, and the
// same command (same port, secret and run id) started again at once:
// node 1's old guard, still trying to tell the old store, reaches the new
// job's store and must not fail it (the claim of node 1 there is another
// launcher's). Both nodes of the new job exit 0.
func TestKilledJobSparesTheNext(t *testing.T) {
	dir := t.TempDir()
	cmds, _, dones := twoSleepingNodes(t, "next-job", "0", dir)
	port := ""
	for i, a := range cmds[0].Args {
		if a == "--master-port" {
			port = cmds[0].Args[i+1]
		}
	}
	cmds[0].Process.Signal(syscall.SIGKILL)
	cmds[1].Process.Signal(syscall.SIGKILL)
	exited(dones[0], 5*time.Second)
	exited(dones[1], 5*time.Second)
	var outs [2]*os.File
	var next [2]chan error
	for n := range 2 {
		_, outs[n], next[n] = startSlimerun(t, "next-job", "--nnodes", "2", "--node-rank", strconv.Itoa(n), "--nproc-per-node", "1",
			"--master-addr", "127.0.0.1", "--master-port", port, "sh", "-c", "sleep 6")
	}
	for n := range 2 {
		code, ok := exited(next[n], 40*time.Second)
		if !ok || code != 0 {
			t.Errorf("the next job's node %d: exit %d (ended %v), want 0:\n%s", n, code, ok, text(outs[n]))
		}
	}
}
