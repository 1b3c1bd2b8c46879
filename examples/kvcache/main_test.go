package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/testbin"
)

// build compiles slimerun and this example into a temporary directory.
func build(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	_, file, _, _ := runtime.Caller(0)
	cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/slimerun", "./examples/kvcache")
	cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return dir
}

// slimerun runs kvcache under slimerun on this host, bounded in time.
func slimerun(t *testing.T, dir string, nproc string, args ...string) (string, int) {
	t.Helper()
	full := append([]string{filepath.Join(dir, "slimerun"), "--standalone", "--nproc-per-node", nproc, filepath.Join(dir, "kvcache"), "--timeout", "20s"}, args...)
	return testbin.Run(t, 2*time.Minute, nil, full...)
}

// nodes runs kvcache as a job of two nodes, each one slimerun with 2 ranks
// (node i's command prefixed with wrap(i): its namespace, say), the store
// at master:port, and waits for both within limit (killing both and
// failing the test then). It returns each node's output and how those
// that failed exited.
func nodes(t *testing.T, dir string, wrap func(int) []string, master string, port int, limit time.Duration, args ...string) ([2]string, []string) {
	t.Helper()
	var outs [2]bytes.Buffer
	var cmds []*exec.Cmd
	done := make(chan error, 2)
	waited := 0
	reap := func() { // no slimerun outlives the test
		for _, c := range cmds {
			c.Process.Kill()
		}
		for ; waited < len(cmds); waited++ {
			<-done
		}
	}
	defer reap()
	for node := range 2 {
		argv := append(wrap(node), filepath.Join(dir, "slimerun"), "-q", "--nnodes", "2", "--node-rank", strconv.Itoa(node),
			"--master-addr", master, "--master-port", strconv.Itoa(port), "--nproc-per-node", "2",
			filepath.Join(dir, "kvcache"))
		cmd := exec.Command(argv[0], append(argv[1:], args...)...)
		cmd.Env = append(os.Environ(), "SLIME_JOB_SECRET=kvcache-nodes-test")
		cmd.Stdout, cmd.Stderr = &outs[node], &outs[node]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
		go func() { done <- cmd.Wait() }()
	}
	deadline := time.After(limit)
	var failed []string
	for waited < len(cmds) {
		select {
		case err := <-done:
			waited++
			if err != nil {
				failed = append(failed, err.Error())
			}
		case <-deadline:
			reap() // the outputs are read once both are waited for: until then exec's goroutines write them
			t.Fatalf("kvcache on two nodes %v: not done within %v:\n%s\n%s", args, limit, outs[0].String(), outs[1].String())
		}
	}
	return [2]string{outs[0].String(), outs[1].String()}, failed
}

// TestKVCacheNodeFails: two nodes on this host (two slimeruns on
// loopback), a decode rank of node 1 finds a wrong byte and fails. Node
// 1's launcher stops its ranks and aborts the attempt in the store; the
// prefill ranks of node 0, waiting at the round's barrier, must fail at
// once (the barrier's keys are under the attempt's prefix), not after
// their --timeout (60 s per wait here, 4 minutes for the run).
func TestKVCacheNodeFails(t *testing.T) {
	dir := build(t)
	noWrap := func(int) []string { return nil }
	outs, failed := nodes(t, dir, noWrap, "127.0.0.1", testbin.FreePort(t), 30*time.Second,
		"--pages", "256", "--batch", "16", "--corrupt-page", "4", "--timeout", "60s")
	// Node 0 learns it from its ranks, whose barrier is aborted by the
	// decode rank's launcher, or, when that launcher's failure report
	// reaches node 0's launcher before any of its ranks prints, from the
	// launcher itself, which stops the ranks: both name the rank.
	named := regexp.MustCompile(`aborted \(prefix [^)]*\) by rank [23]: rank [23] \(pid \d+\) exited with code 1`).MatchString(outs[0]) ||
		regexp.MustCompile(`a worker of node 1 failed: rank [23] \(pid \d+\) exited with code 1`).MatchString(outs[0])
	if len(failed) != 2 || !strings.Contains(outs[1], "wrong data") || !named {
		t.Fatalf("want both nodes failed, node 1 naming the wrong data, node 0 the decode rank that exited; failed %v:\n%s\n%s", failed, outs[0], outs[1])
	}
}

// TestKVCache runs the example under slimerun, as real processes: 2
// prefill and 2 decode ranks over the same-host transport, 3 prefill and 1
// decode over TCP with pages that do not divide evenly, the caches in GPU
// memory through CUDA IPC and over TCP, and every decode
// rank reports every page checked with no wrong byte. A page sent with
// one wrong byte must make the job exit non-zero, naming the wrong data.
func TestKVCache(t *testing.T) {
	dir := build(t)
	// The GPU cases run on the emulated CUDA library where there is no
	// GPU (the ranks inherit SLIME_CUDA_LIB).
	gpuErr := device.UseEmulator(0)
	for _, tc := range []struct {
		name, nproc string
		args        []string
		prefill     int
		transport   string
	}{
		{"2+2 same host", "4", []string{"--pages", "512", "--page-size", "8K", "--batch", "64"}, 2, "[cma]"},
		{"3+1 tcp", "4", []string{"--prefill", "3", "--tcp-only", "--pages", "301", "--page-size", "3000", "--batch", "16", "--inflight", "2"}, 3, "[tcp]"},
		// More batches a round from each prefill rank than the endpoint
		// keeps immediates of one peer: the decode rank must take every
		// rank's as they come. (Which transports carry them depends on
		// when the same-host one is set up: not checked.)
		{"2+1 many batches", "3", []string{"--prefill", "2", "--pages", "40000", "--page-size", "64", "--batch", "1", "--rounds", "1"}, 2, ""},
		// GPU memory (the emulated CUDA library here): device to device
		// through CUDA IPC, and staged over TCP.
		{"2+2 gpu", "4", []string{"--gpu", "--pages", "256", "--page-size", "8K", "--batch", "32"}, 2, "[ipc]"},
		{"1+1 gpu tcp", "2", []string{"--gpu", "--tcp-only", "--pages", "100", "--page-size", "5000", "--batch", "8"}, 1, "[tcp]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if strings.Contains(tc.name, "gpu") && gpuErr != nil {
				t.Skip("no CUDA backend:", gpuErr)
			}
			out, code := slimerun(t, dir, tc.nproc, tc.args...)
			if n, _ := strconv.Atoi(tc.nproc); code != 0 || strings.Count(out, "PASS rank") != n || strings.Count(out, "(prefill)") != tc.prefill ||
				tc.transport != "" && strings.Count(out, "over "+tc.transport) != tc.prefill || strings.Contains(out, " 0 pages") {
				t.Fatalf("exit %d:\n%s", code, out)
			}
		})
	}
	t.Run("a wrong byte", func(t *testing.T) {
		out, code := slimerun(t, dir, "2", "--pages", "64", "--batch", "8", "--corrupt-page", "5")
		if code == 0 || !strings.Contains(out, "wrong data: round 0: 1 wrong bytes") {
			t.Fatalf("exit %d, want a failure naming the wrong byte:\n%s", code, out)
		}
	})
}

// TestKVCachePrefillKilled: two nodes on this host (two slimeruns on
// loopback), prefill rank 0 of node 0 is killed (SIGKILL) in the middle of
// the rounds. The decode ranks of node 1, waiting for its pages'
// immediates, must fail within seconds naming a lost peer, not wait for
// --timeout (60 s a wait here).
func TestKVCachePrefillKilled(t *testing.T) {
	dir := build(t)
	noWrap := func(int) []string { return nil }
	go func() {
		// Rank 0 is the kvcache process of this test's binary with
		// RANK=0 in its environment, once it has run a while.
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if pid := rankPid(dir, 0); pid > 0 {
				time.Sleep(time.Second)
				syscall.Kill(pid, syscall.SIGKILL)
				return
			}
		}
	}()
	start := time.Now()
	outs, failed := nodes(t, dir, noWrap, "127.0.0.1", testbin.FreePort(t), 40*time.Second,
		"--pages", "256", "--batch", "16", "--rounds", "100000", "--timeout", "60s")
	// Node 1's ranks learn it from their link to rank 0 (Peer.Imm), or
	// to rank 1, which node 0's launcher stops at once, whichever link's
	// end they read first; or, when they are at a round's barrier, from
	// the store's abort; or node 1's launcher learns it from node 0's
	// failure report first and stops them before they print.
	lost := regexp.MustCompile(`peer "rank[01]"`).MatchString(outs[1]) ||
		regexp.MustCompile(`aborted \(prefix [^)]*\) by rank 0: rank 0 \(pid \d+\) was killed by signal 9`).MatchString(outs[1]) ||
		regexp.MustCompile(`a worker of node 0 failed: rank 0 \(pid \d+\) was killed by signal 9`).MatchString(outs[1])
	if len(failed) != 2 || !lost || time.Since(start) > 30*time.Second {
		t.Fatalf("want both nodes failed within 30 s, node 1 naming a lost prefill rank; failed %v after %v:\n%s\n%s", failed, time.Since(start), outs[0], outs[1])
	}
	t.Logf("after %v:\n%s\n%s", time.Since(start), outs[0], outs[1])
}

// rankPid is the pid of the process running dir's kvcache as rank rank,
// or 0.
func rankPid(dir string, rank int) int { return testbin.RankPid(filepath.Join(dir, "kvcache"), rank) }

// TestKVCacheBadFlags: nonsense flags are refused at once, naming the
// flag, before anything is allocated (no panic, no runtime out of memory,
// no run that passes without doing what was asked).
func TestKVCacheBadFlags(t *testing.T) {
	dir := build(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--timeout", "0s"}, "--timeout 0s: want a positive duration"},
		{[]string{"--inflight", "0"}, "--inflight 0: want a positive count"},
		{[]string{"--rounds", "-1"}, "--rounds -1: want a positive count"},
		{[]string{"--batch", "0"}, "--batch 0: want 1 to 4096 pages"},
		{[]string{"--corrupt-page", "99999"}, "--corrupt-page 99999: not a page of prefill rank 0"},
		{[]string{"--page-size", "1G"}, "more than the"},
		{[]string{"--pages", "8589934592", "--page-size", "1G", "--batch", "1", "--inflight", "1"}, "a decode rank's cache (--pages × --page-size) is 9223372036854775808 bytes"},
		{[]string{"--inflight", "9223372036854775807"}, "a prefill rank's staging area"},
		// Three ranks, two prefill: page 1 is rank 1's.
		{[]string{"--prefill", "2", "--corrupt-page", "1"}, "--corrupt-page 1: not a page of prefill rank 0"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			nproc := "2"
			if slices.Contains(tc.args, "--prefill") {
				nproc = "3"
			}
			out, code := slimerun(t, dir, nproc, tc.args...)
			if code == 0 || !strings.Contains(out, tc.want) || strings.Contains(out, "panic") || strings.Contains(out, "fatal error") {
				t.Fatalf("exit %d, want a failure saying %q:\n%s", code, tc.want, out)
			}
		})
	}
}
