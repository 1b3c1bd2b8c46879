package main

import (
	"fmt"
	"os"
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
	}
	if strings.Contains(text(outs[1]), "died") {
		t.Errorf("node 1 reports a death:\n%s", text(outs[1]))
	}
}
