package main

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slimego/slimego/rendezvous"
)

// TestSignalDuringRendezvous: SIGTERM or SIGINT to a node's slimerun
// while it waits in the rendezvous for a node that has not come ends it at
// once, exit 128+signal saying so, and calls the rendezvous off for the
// others: node 0 fails within seconds naming node 1 and the signal, not
// after its rendezvous timeout (a minute here).
func TestSignalDuringRendezvous(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			port := freePortString(t)
			start := func(rank string) (*exec.Cmd, *os.File, chan error) {
				return startSlimerun(t, "rdzv-signal", "--nnodes", "3", "--node-rank", rank, "--nproc-per-node", "1",
					"--master-addr", "127.0.0.1", "--master-port", port, "--rdzv-timeout", "60s", "--stop-grace", "1s", "true")
			}
			_, out0, done0 := start("0")
			n1, out1, done1 := start("1")
			// Node 1 is at the node barrier once it has published its
			// placement (after its claim) in node 0's store.
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			st, err := rendezvous.Dial(ctx, "127.0.0.1:"+port, rendezvous.Auth{Secret: []byte("rdzv-signal"), Job: "p" + port})
			if err != nil {
				t.Fatalf("node 0's store: %v\n%s", err, text(out0))
			}
			for {
				ok, err := st.Check(ctx, "slimerun/p"+port+"/placement/1")
				if err != nil {
					t.Fatalf("node 1 did not reach the barrier: %v\n%s", err, text(out1))
				}
				if ok {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			st.Close() // node 0's store serves its clients for a while after its end
			t0 := time.Now()
			n1.Process.Signal(sig)
			wait := func(done chan error, what string, out *os.File) int {
				code, ok := exited(done, 15*time.Second)
				if !ok {
					t.Fatalf("%s still runs %v after node 1's %v\n%s", what, time.Since(t0).Round(time.Millisecond), sig, text(out))
				}
				return code
			}
			if code := wait(done1, "node 1", out1); code != 128+int(sig) || !strings.Contains(text(out1), "interrupted by") {
				t.Errorf("node 1: exit %d, want %d saying it was interrupted:\n%s", code, 128+int(sig), text(out1))
			}
			if code := wait(done0, "node 0", out0); code != 1 || !strings.Contains(text(out0), "node 1 was interrupted by "+sig.String()) {
				t.Errorf("node 0: exit %d, want 1 naming node 1's %v:\n%s", code, sig, text(out0))
			}
			t.Logf("node 1:\n%snode 0:\n%s", text(out1), text(out0))
		})
	}
}

// exited waits up to within for a slimerun of startSlimerun's to end:
// its exit code (0 for success, -1 where it did not run), or ok false
// while it still runs. done gets the result back, for the cleanup.
func exited(done chan error, within time.Duration) (code int, ok bool) {
	select {
	case err := <-done:
		done <- err
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			return ee.ExitCode(), true
		case err != nil:
			return -1, true
		}
		return 0, true
	case <-time.After(within):
		return 0, false
	}
}

// text is what a process has written to f so far.
func text(f *os.File) string {
	b, _ := os.ReadFile(f.Name())
	return string(b)
}

// TestSignalStopsOtherNodes: SIGTERM to one node's slimerun once the
// workers run stops that node's workers and the other nodes' too (a
// worker stuck outside any collective call would otherwise keep its node
// running): node 0 ends within seconds, naming node 1's signal. With
// restarts left, node 0 does not restart its workers either (they would
// wait for node 1's in the next attempt's rendezvous until its timeout).
func TestSignalStopsOtherNodes(t *testing.T) {
	for _, restarts := range []string{"0", "3"} {
		t.Run("max-restarts="+restarts, func(t *testing.T) { signalStopsOtherNodes(t, restarts) })
	}
}

func signalStopsOtherNodes(t *testing.T, restarts string) {
	dir := t.TempDir()
	cmds, outs, dones := twoSleepingNodes(t, "stop-others", restarts, dir)
	t0 := time.Now()
	cmds[1].Process.Signal(syscall.SIGTERM)
	for n, want := range []int{1, 128 + int(syscall.SIGTERM)} {
		code, ok := exited(dones[n], 15*time.Second)
		if !ok {
			t.Fatalf("node %d still runs %v after node 1's SIGTERM:\n%s", n, time.Since(t0).Round(time.Millisecond), text(outs[n]))
		}
		if code != want {
			t.Errorf("node %d: exit %d, want %d:\n%s", n, code, want, text(outs[n]))
		}
	}
	if !strings.Contains(text(outs[0]), "node 1 was interrupted by terminated") {
		t.Errorf("node 0 does not name node 1's signal:\n%s", text(outs[0]))
	}
	if m, _ := filepath.Glob(dir + "/up.*.[1-9]"); len(m) > 0 || strings.Contains(text(outs[0]), "restarting") {
		t.Errorf("workers were restarted after node 1's signal (%v):\n%s", m, text(outs[0]))
	}
}

// twoSleepingNodes starts a job of two nodes of one worker each, under the
// job secret and --max-restarts restarts, whose workers mark their start
// in dir (up.RANK.ATTEMPT) and sleep; it returns once both workers have
// started and the launchers watch each other for failures.
func twoSleepingNodes(t *testing.T, secret, restarts, dir string) (cmds [2]*exec.Cmd, outs [2]*os.File, dones [2]chan error) {
	t.Helper()
	port := freePortString(t)
	for n := range 2 {
		cmds[n], outs[n], dones[n] = startSlimerun(t, secret, "--nnodes", "2", "--node-rank", strconv.Itoa(n), "--nproc-per-node", "1",
			"--master-addr", "127.0.0.1", "--master-port", port, "--stop-grace", "1s", "--max-restarts", restarts,
			"sh", "-c", "touch "+dir+"/up.$RANK.$TORCHELASTIC_RESTART_COUNT; exec sleep 60")
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		_, e0 := os.Stat(dir + "/up.0.0")
		_, e1 := os.Stat(dir + "/up.1.0")
		if e0 == nil && e1 == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the workers did not start:\n%s\n%s", text(outs[0]), text(outs[1]))
		}
	}
	time.Sleep(200 * time.Millisecond) // the failure watches are on
	return cmds, outs, dones
}

// freePortString is a TCP port of loopback free when it is asked for.
func freePortString(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// startSlimerun starts slimerun with args and the job secret, its output
// in a file; done yields its Wait once (the cleanup kills it and waits).
func startSlimerun(t *testing.T, secret string, args ...string) (cmd *exec.Cmd, out *os.File, done chan error) {
	t.Helper()
	cmd = exec.Command(slimerun, args...)
	cmd.Env = append(os.Environ(), "SLIME_JOB_SECRET="+secret)
	out, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done = make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill(); done <- <-done; out.Close() })
	return cmd, out, done
}

// TestStartFailureStopsOtherNodes: a node that cannot start its workers
// (here its program names an interpreter that does not exist) ends the job on every node,
// with or without restarts left: node 0 stops its running workers and
// ends within seconds naming node 1's rank and why it did not start,
// rather than restarting them into a rendezvous that node 1 never joins
// (and failing only at its timeout).
func TestStartFailureStopsOtherNodes(t *testing.T) {
	for _, restarts := range []string{"0", "3"} {
		t.Run("max-restarts="+restarts, func(t *testing.T) { startFailureStopsOtherNodes(t, restarts) })
	}
}

func startFailureStopsOtherNodes(t *testing.T, restarts string) {
	port := freePortString(t)
	dir := t.TempDir()
	missing := filepath.Join(dir, "no-such-program")
	prog := filepath.Join(dir, "prog")
	if err := os.WriteFile(prog, []byte("#!"+missing+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var outs [2]*os.File
	var dones [2]chan error
	t0 := time.Now()
	for n, prog := range [][]string{{"sh", "-c", "touch " + dir + "/up.$RANK.$TORCHELASTIC_RESTART_COUNT; exec sleep 60"}, {prog}} {
		_, outs[n], dones[n] = startSlimerun(t, "start-fails", append([]string{"--nnodes", "2", "--node-rank", strconv.Itoa(n), "--nproc-per-node", "1",
			"--master-addr", "127.0.0.1", "--master-port", port, "--stop-grace", "1s", "--max-restarts", restarts, "--rdzv-timeout", "60s"}, prog...)...)
	}
	for n := range 2 {
		code, ok := exited(dones[n], 20*time.Second)
		if !ok {
			t.Fatalf("node %d still runs %v after the start:\nnode 0:\n%s\nnode 1:\n%s", n, time.Since(t0).Round(time.Millisecond), text(outs[0]), text(outs[1]))
		}
		if code != 1 {
			t.Errorf("node %d: exit %d, want 1:\n%s", n, code, text(outs[n]))
		}
	}
	for n := range 2 {
		if s := text(outs[n]); !strings.Contains(s, "start rank 1") || !strings.Contains(s, prog+": no such file") {
			t.Errorf("node %d does not name rank 1's start and its program:\n%s", n, s)
		}
	}
	if m, _ := filepath.Glob(dir + "/up.*.[1-9]"); len(m) > 0 || strings.Contains(text(outs[0]), "restarting") {
		t.Errorf("workers were restarted after node 1's start failed (%v):\n%s", m, text(outs[0]))
	}
	t.Logf("node 0:\n%snode 1:\n%s", text(outs[0]), text(outs[1]))
}

// TestMissingProgramCallsOffRendezvous: a node whose program does not
// exist there fails its launcher as bad usage (exit 2) and, across
// nodes, first calls the rendezvous off: the other node fails within
// seconds naming that node and the program, not at its rendezvous
// timeout (a minute here). Either node may be the one missing it, and
// the program may be a Python script (run by python3) that is missing.
func TestMissingProgramCallsOffRendezvous(t *testing.T) {
	for _, name := range []string{"no-such-program", "no-such-script.py"} {
		for _, bad := range []int{0, 1} {
			t.Run(name+"/node"+strconv.Itoa(bad), func(t *testing.T) { missingProgram(t, name, bad) })
		}
	}
}

func missingProgram(t *testing.T, name string, bad int) {
	port := freePortString(t)
	missing := filepath.Join(t.TempDir(), name)
	var outs [2]*os.File
	var dones [2]chan error
	t0 := time.Now()
	for n := range 2 {
		prog := "true"
		if n == bad {
			prog = missing
		}
		_, outs[n], dones[n] = startSlimerun(t, "no-program", "--nnodes", "2", "--node-rank", strconv.Itoa(n), "--nproc-per-node", "1",
			"--master-addr", "127.0.0.1", "--master-port", port, "--rdzv-timeout", "60s", prog)
	}
	for n := range 2 {
		want := 1
		if n == bad {
			want = 2
		}
		code, ok := exited(dones[n], 20*time.Second)
		if !ok {
			t.Fatalf("node %d still runs %v after the start:\nnode 0:\n%s\nnode 1:\n%s", n, time.Since(t0).Round(time.Millisecond), text(outs[0]), text(outs[1]))
		}
		if code != want {
			t.Errorf("node %d: exit %d, want %d:\n%s", n, code, want, text(outs[n]))
		}
	}
	for n := range 2 {
		if s := text(outs[n]); !strings.Contains(s, "node "+strconv.Itoa(bad)) || !strings.Contains(s, missing) {
			t.Errorf("node %d does not name node %d and the program:\n%s", n, bad, s)
		}
	}
	t.Logf("node 0:\n%snode 1:\n%s", text(outs[0]), text(outs[1]))
}
