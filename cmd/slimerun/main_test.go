package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/testbin"
)

var slimerun string

func TestMain(m *testing.M) {
	if os.Getenv("SLIMERUN_TEST_WORKER") == "shm" {
		os.Exit(shmWorker())
	}
	if os.Getenv("SLIMERUN_TEST_WORKER") == "waitpeer" {
		os.Exit(waitPeerWorker())
	}
	// The tests that send slimerun SIGHUP need it not ignored: where the
	// tests run under nohup, a handler here gives the slimeruns they start
	// SIGHUP's default (exec resets a handled signal, not an ignored one),
	// and TestNohupSurvivesHangup starts its own under nohup.
	if signal.Ignored(syscall.SIGHUP) {
		signal.Notify(make(chan os.Signal, 1), syscall.SIGHUP)
	}
	dir, err := testbin.Build()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	slimerun = filepath.Join(dir, "slimerun")
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

// startJob starts slimerun with workers that record their pids and sleep.
func startJob(t *testing.T, extra ...string) (*exec.Cmd, string, *bytes.Buffer) {
	t.Helper()
	dir := t.TempDir()
	args := append([]string{"--standalone", "--nproc_per_node", "3", "--stop-grace", "1s"}, extra...)
	args = append(args, "sh", "-c", `trap 'echo got TERM; exit 0' TERM; echo $$ > `+dir+`/pid.$RANK; while :; do sleep 0.05; done`)
	cmd := exec.Command(slimerun, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for r := 0; r < 3; r++ {
		for {
			if _, err := os.Stat(filepath.Join(dir, "pid."+strconv.Itoa(r))); err == nil {
				break
			}
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				t.Fatalf("workers did not start:\n%s", out.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	time.Sleep(50 * time.Millisecond) // let each shell install its trap and loop
	return cmd, dir, &out
}

func workerPids(t *testing.T, dir string) []int {
	var pids []int
	for r := range 3 {
		b, err := os.ReadFile(filepath.Join(dir, "pid."+strconv.Itoa(r)))
		if err != nil {
			t.Fatal(err)
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		pids = append(pids, pid)
	}
	return pids
}

func waitGone(t *testing.T, pids []int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for syscall.Kill(pid, 0) == nil {
			if time.Now().After(deadline) {
				t.Fatalf("worker %d outlived slimerun", pid)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

func TestSignalReachesEveryWorker(t *testing.T) {
	// SIGQUIT and SIGHUP too, as torchrun forwards them.
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGHUP} {
		cmd, dir, out := startJob(t)
		pids := workerPids(t, dir)
		cmd.Process.Signal(sig)
		err := cmd.Wait()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 128+int(sig) {
			t.Errorf("%v: slimerun exit %v, want %d\n%s", sig, err, 128+int(sig), out.String())
		}
		// SIGINT reaches the shells as SIGINT (no trap: they die of it);
		// SIGTERM runs their trap.
		if sig == syscall.SIGTERM && strings.Count(out.String(), "got TERM") != 3 {
			t.Errorf("not every worker saw SIGTERM:\n%s", out.String())
		}
		waitGone(t, pids)
	}
}

func TestNoWorkerOutlivesKilledLauncher(t *testing.T) {
	cmd, dir, _ := startJob(t)
	pids := workerPids(t, dir)
	cmd.Process.Kill()
	cmd.Wait()
	waitGone(t, pids)
}

// --nproc-per-node as torchrun reads it: gpu needs GPUs, auto falls back
// to one worker per CPU.
func TestNProcWords(t *testing.T) {
	gpus, gpuErr := countGPUs()
	for _, tc := range []struct {
		word string
		want int
	}{{"cpu", runtime.NumCPU()}, {"auto", map[bool]int{true: gpus, false: runtime.NumCPU()}[gpuErr == nil && gpus > 0]}, {"4", 4}} {
		if n, err := parseNProc(tc.word); err != nil || n != tc.want {
			t.Errorf("%s: %d, %v; want %d", tc.word, n, err, tc.want)
		}
	}
	if n, err := parseNProc("gpu"); (gpuErr == nil) != (err == nil) || (err == nil && n != gpus) {
		t.Errorf("gpu: %d, %v (GPUs: %d, %v)", n, err, gpus, gpuErr)
	}
}

// --print-topology alone prints the machine and exits 0; with a program it
// runs the program after.
func TestPrintTopology(t *testing.T) {
	out, err := exec.Command(slimerun, "--print-topology").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "CPUs: ") || !strings.Contains(string(out), "GPUs: ") || !strings.Contains(string(out), "CUDA backend: ") {
		t.Fatalf("err %v\n%s", err, out)
	}
	out, err = exec.Command(slimerun, "--print-topology", "-q", "--standalone", "echo", "ran").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "[0]: ran") {
		t.Fatalf("with a program: err %v\n%s", err, out)
	}
}

func TestUsageErrors(t *testing.T) {
	cases := [][]string{
		{"--nproc-per-node", "zero", "true"},
		{"--nnodes", "1:4", "true"},
		{"--redirects", "9", "true"},
		{"--standalone"},
	}
	for _, args := range cases {
		out, err := exec.Command(slimerun, args...).CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
			t.Errorf("%v: err %v, want exit 2\n%s", args, err, out)
		}
	}
}

func TestProgramArgumentsPassThrough(t *testing.T) {
	out, err := exec.Command(slimerun, "-q", "--standalone", "sh", "-c", `echo "$@"`, "x", "--nproc-per-node", "5", "-v").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "[0]: --nproc-per-node 5 -v") {
		t.Fatalf("%v\n%s", err, out)
	}
}

// TestSignalKillsGrandchildren: SIGTERM or SIGINT to slimerun stops the
// workers, and a child of theirs that ignores both (and writes nowhere,
// so that the workers' exits are seen at once) is killed with their
// process groups before slimerun exits, not left to the init process.
func TestSignalKillsGrandchildren(t *testing.T) {
	// SIGQUIT and SIGHUP too, as torchrun forwards them.
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGHUP} {
		t.Run(sig.String(), func(t *testing.T) {
			dir := t.TempDir()
			cmd := exec.Command(slimerun, "--standalone", "--nproc-per-node", "2", "--stop-grace", "500ms", "sh", "-c",
				`(trap '' TERM INT; exec sleep 600) >/dev/null 2>&1 & echo $! > `+dir+`/g.tmp.$RANK; mv `+dir+`/g.tmp.$RANK `+dir+`/pid.$RANK; exec sleep 30`)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			var pids []int
			deadline := time.Now().Add(10 * time.Second)
			for r := range 2 {
				for {
					b, err := os.ReadFile(filepath.Join(dir, "pid."+strconv.Itoa(r)))
					if err == nil {
						pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
						pids = append(pids, pid)
						break
					}
					if time.Now().After(deadline) {
						cmd.Process.Kill()
						cmd.Wait()
						t.Fatalf("workers did not start:\n%s", out.String())
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			defer func() {
				for _, pid := range pids {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}()
			cmd.Process.Signal(sig)
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			var err error
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				cmd.Process.Kill()
				t.Fatalf("slimerun did not exit within 10 s of %v:\n%s", sig, out.String())
			}
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 128+int(sig) {
				t.Errorf("slimerun exit %v, want %d\n%s", err, 128+int(sig), out.String())
			}
			// slimerun has exited: a SIGKILL it sent may still be on its way.
			deadline = time.Now().Add(3 * time.Second)
			for r := range 2 {
				if pid, outlived := testbin.Outlived(t, filepath.Join(dir, "pid."+strconv.Itoa(r)), deadline); outlived {
					t.Errorf("a worker's child (pid %d), which ignores %v, outlived slimerun", pid, sig)
				}
			}
		})
	}
}

// The workers read slimerun's standard input, as torchrun's do (its
// workers inherit it): `data | slimerun prog`, or pdb's breakpoint() in a
// one-worker job. They got /dev/null, an end of file at once.
func TestStdinReachesWorkers(t *testing.T) {
	cmd := exec.Command(slimerun, "-q", "--standalone", "sh", "-c", `read line && echo "got $line"`)
	cmd.Stdin = strings.NewReader("hello there\n")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "[0]: got hello there") {
		t.Fatalf("%v, want the worker to read slimerun's stdin:\n%s", err, out)
	}
}
