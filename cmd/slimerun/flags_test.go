package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/machine"
	"github.com/slimego/slimego/internal/shm"
	"github.com/slimego/slimego/internal/testbin"
	"github.com/slimego/slimego/launcher"
)

func TestParseEndpoint(t *testing.T) {
	for _, tc := range []struct {
		in   string
		host string
		port int
	}{
		{"10.0.0.1:29500", "10.0.0.1", 29500},
		{"node0", "node0", 29400},
		{"[::1]:1234", "::1", 1234},
		{"[fd00::2]", "fd00::2", 29400},
		{":29500", "", 0},
		{"host:port", "", 0},
		{"host:70000", "", 0},
		{"localhost:0", "localhost", 0}, // torchrun's free port, on one node
		{"[::1", "", 0},
		{"a:1:2", "", 0},
		{"::1", "", 0},
		{"[nothost]:1", "", 0},
		{"[::1]x", "", 0},
	} {
		h, p, err := parseEndpoint(tc.in)
		if tc.host == "" {
			if err == nil {
				t.Errorf("%q: %s %d, want an error", tc.in, h, p)
			}
			continue
		}
		if err != nil || h != tc.host || p != tc.port {
			t.Errorf("%q: %q %d %v; want %q %d", tc.in, h, p, err, tc.host, tc.port)
		}
	}
}

func TestParseRdzvConf(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		bad  bool
	}{
		{"timeout=90", 90 * time.Second, false},
		{"read_timeout=60,timeout=1.5", 1500 * time.Millisecond, false},
		{"join_timeout=600, last_call_timeout=30", 600 * time.Second, false},
		{"read_timeout=60", 0, false},
		{"timeout=soon", 0, true},
		{"timeout", 0, true},
		{"no_such_key=1", 0, true},
		// Numbers no duration holds, or none at all: refused, not
		// dropped for the default.
		{"timeout=nan", 0, true},
		{"timeout=inf", 0, true},
		{"timeout=1e10", 0, true},
		{"timeout=1e-12", 0, true},
		{"timeout=-5", 0, true},
	} {
		got, err := parseRdzvConf(tc.in)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("%q: %v, %v; want %v (error: %v)", tc.in, got, err, tc.want, tc.bad)
		}
	}
}

// Flags slimerun refuses with exit 2 and a message that says why.
func TestFlagErrors(t *testing.T) {
	dir := t.TempDir()
	open := filepath.Join(dir, "secret")
	if err := os.WriteFile(open, []byte("s3cret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(open, 0o644)
	tooMany := strconv.Itoa(launcher.MaxWorkersPerCore*runtime.NumCPU() + 1)
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--rdzv-backend", "etcd", "true"}, "want static or c10d"},
		{[]string{"--rdzv-endpoint", "h:p", "true"}, "want host[:port]"},
		{[]string{"--rdzv-conf", "bogus=1", "true"}, "unknown key"},
		{[]string{"--standalone", "--job-secret-file", open, "true"}, "chmod 600"},
		{[]string{"--standalone", "--nproc-per-node", tooMany, "true"}, "--force"},
		{[]string{"--bind-to", "socket", "true"}, "want core or none"},
		{[]string{"--standalone", "--nnodes", "2", "true"}, "--standalone runs one node"},
		{[]string{"--standalone", "--node-rank", "1", "true"}, "--standalone runs one node"},
		{[]string{"--rdzv-endpoint", "[::1", "true"}, "want host[:port]"},
		{[]string{"--rdzv-endpoint", "a:1:2", "true"}, "want host[:port]"},
		// Port 0 was taken as 29500 without a word.
		{[]string{"--master-port", "0", "true"}, "--master-port 0: a free port is for --standalone"},
		// Values that were taken as the default without a word (a grace
		// of 0 waited 5 s, a join timeout of 0 five minutes).
		{[]string{"--standalone", "--stop-grace", "0", "true"}, "--stop-grace 0s: want a positive duration"},
		{[]string{"--standalone", "--stop-grace", "-1s", "true"}, "--stop-grace -1s: want a positive duration"},
		{[]string{"--standalone", "--monitor-interval", "0", "true"}, "--monitor-interval 0s: want a positive duration"},
		{[]string{"--standalone", "--rdzv-timeout", "-5s", "true"}, "--rdzv-timeout -5s: want a positive duration"},
		{[]string{"--standalone", "--rdzv-timeout", "0", "true"}, "--rdzv-timeout 0s: want a positive duration"},
		{[]string{"--standalone", "--max-restarts", "-1", "true"}, "--max-restarts -1: want 0 or more"},
		// Flags without a program printed every flag's help, the
		// missing program nowhere.
		{[]string{"--standalone", "--nproc-per-node", "2"}, "slimerun: no program to run"},
	} {
		out, err := exec.Command(slimerun, tc.args...).CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), tc.msg) {
			t.Errorf("%v: err %v, want exit 2 saying %q\n%s", tc.args, err, tc.msg, out)
		}
		if strings.Contains(string(out), "[0]:") {
			t.Errorf("%v: a worker ran:\n%s", tc.args, out)
		}
	}
}

// torchrun's rendezvous flags: the store listens on --rdzv-endpoint's
// port; the workers' MASTER_PORT is another, free port, and they learn the
// store's from SLIME_STORE_PORT; a secret file's first line reaches them.
func TestRdzvEndpointAndSecretFile(t *testing.T) {
	port := testbin.FreePort(t)
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("from-the-file\nsecond line\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(slimerun, "-q", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:"+strconv.Itoa(port),
		"--rdzv-conf", "timeout=30,read_timeout=60", "--rdzv_id", "flags", "--job-secret-file", secret, "--nnodes", "1",
		"sh", "-c", `echo "A=$MASTER_ADDR P=$MASTER_PORT S=$SLIME_STORE_PORT U=$TORCHELASTIC_USE_AGENT_STORE K=$SLIME_JOB_SECRET"`).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	want := "S=" + strconv.Itoa(port) + " U=False K=from-the-file"
	if !strings.Contains(string(out), "[0]: A=127.0.0.1 P=") || !strings.Contains(string(out), want) || strings.Contains(string(out), "P="+strconv.Itoa(port)+" ") {
		t.Fatalf("want MASTER_ADDR 127.0.0.1, MASTER_PORT other than %d and %q:\n%s", port, want, out)
	}
}

// Beyond WarnWorkersPerCore workers per core slimerun warns, even -q, and
// runs them.
func TestManyWorkersWarn(t *testing.T) {
	n := launcher.WarnWorkersPerCore*runtime.NumCPU() + 1
	out, err := exec.Command(slimerun, "-q", "--standalone", "--nproc-per-node", strconv.Itoa(n), "true").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "slimerun: WARNING: "+strconv.Itoa(n)+" workers on") {
		t.Fatalf("%v\n%s", err, out)
	}
}

// shmWorker is a worker of TestKilledJobSwept: local rank 0 creates a
// shared-memory segment of the job, tagged with its pid as Init's are, and
// every rank records its pid and waits to be killed.
func shmWorker() int {
	dir := os.Getenv("SLIMERUN_TEST_DIR")
	local := os.Getenv("LOCAL_RANK")
	if local == "0" {
		name, err := shm.NewName(shm.JobPrefix(os.Getenv("SLIME_RUN_ID")))
		if err == nil {
			_, err = shm.Create(name, 4096)
		}
		if err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			return 1
		}
		os.WriteFile(filepath.Join(dir, "seg"), []byte(name), 0o600)
	}
	// A child in the worker's process group, as a script's background
	// job or a data loader is.
	child := exec.Command("sleep", "600")
	if err := child.Start(); err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 1
	}
	os.WriteFile(filepath.Join(dir, "child."+local), []byte(strconv.Itoa(child.Process.Pid)), 0o600)
	os.WriteFile(filepath.Join(dir, "pid."+local), []byte(strconv.Itoa(os.Getpid())), 0o600)
	time.Sleep(10 * time.Minute)
	return 0
}

// startShmJob runs slimerun with 3 shmWorkers and returns it once every
// worker has started, with their pids, their children's, and the
// segment's path.
func startShmJob(t *testing.T, run string) (cmd *exec.Cmd, pids, children []int, seg string, out *syncWriter) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd = exec.Command(slimerun, "--standalone", "--nproc-per-node", "3", "--rdzv-id", run, exe)
	tmp := filepath.Join(dir, "tmp") // slimerun's own temporary files (its workers' error files)
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(os.Environ(), "SLIMERUN_TEST_WORKER=shm", "SLIMERUN_TEST_DIR="+dir, "TMPDIR="+tmp)
	out = &syncWriter{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	deadline := time.Now().Add(20 * time.Second)
	for r := 0; r < 3; {
		b, err := os.ReadFile(filepath.Join(dir, "pid."+strconv.Itoa(r)))
		c, err2 := os.ReadFile(filepath.Join(dir, "child."+strconv.Itoa(r)))
		if err == nil && err2 == nil && len(b) > 0 && len(c) > 0 {
			pid, _ := strconv.Atoi(string(b))
			kid, _ := strconv.Atoi(string(c))
			pids, children = append(pids, pid), append(children, kid)
			r++
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("the workers did not start:\n%s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Cleanup(func() { // whatever the test leaves
		for _, p := range append(pids, children...) {
			syscall.Kill(p, syscall.SIGKILL)
		}
	})
	b, err := os.ReadFile(filepath.Join(dir, "seg"))
	if err != nil {
		t.Fatalf("no segment: %v\n%s", err, out.String())
	}
	seg = filepath.Join(shm.Dir, string(b))
	if _, err := os.Stat(seg); err != nil {
		t.Fatalf("the worker's segment: %v", err)
	}
	t.Cleanup(func() { os.Remove(seg) })
	return cmd, pids, children, seg, out
}

// guardOf is the pid of slimerun pid's guard process (SLIME_LAUNCHER_GUARD
// in its environment), or 0.
func guardOf(pid int) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		f, ok := machine.StatFields(st)
		if !ok || len(f) < 2 || f[1] != strconv.Itoa(pid) {
			continue
		}
		env, _ := os.ReadFile("/proc/" + e.Name() + "/environ")
		if bytes.Contains(env, []byte("\x00SLIME_LAUNCHER_GUARD=1\x00")) || bytes.HasPrefix(env, []byte("SLIME_LAUNCHER_GUARD=1\x00")) {
			return p
		}
	}
	return 0
}

// TestKilledLauncherLeavesNothing: slimerun killed with SIGKILL cannot
// stop anything itself; its workers die with it (Pdeathsig), and its
// guard process kills what they started in their process groups and
// removes the job's shared memory, within seconds, with no next job.
func TestKilledLauncherLeavesNothing(t *testing.T) {
	cmd, pids, children, seg, out := startShmJob(t, "guarded"+strconv.Itoa(os.Getpid()))
	if guardOf(cmd.Process.Pid) == 0 {
		t.Fatalf("slimerun (pid %d) has no guard process", cmd.Process.Pid)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait() // its output ends when the guard is done: it holds stderr
	until := time.Now().Add(10 * time.Second)
	for _, p := range append(pids, children...) {
		for machine.Alive(p) && time.Now().Before(until) {
			time.Sleep(10 * time.Millisecond)
		}
		if machine.Alive(p) {
			t.Errorf("process %d (workers %v, their children %v) outlived slimerun by 10 s\n%s", p, pids, children, out.String())
		}
	}
	for _, err := os.Stat(seg); err == nil && time.Now().Before(until); _, err = os.Stat(seg) {
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := os.Stat(seg); !os.IsNotExist(err) {
		t.Errorf("%s is still there 10 s after slimerun was killed (%v)\n%s", seg, err, out.String())
	}
	if !strings.Contains(out.String(), "died with its job running") {
		t.Errorf("the guard did not say what it cleaned up:\n%s", out.String())
	}
	tmp := ""
	for _, kv := range cmd.Env { // the last one is slimerun's
		if v, ok := strings.CutPrefix(kv, "TMPDIR="); ok {
			tmp = v
		}
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("left in slimerun's TMPDIR %s: %v", tmp, left)
	}
}

// A job killed with its launcher and the launcher's guard (SIGKILL: nobody
// cleans up) leaves its segment in /dev/shm; the next slimerun removes it,
// and no worker of the killed job remains.
func TestKilledJobSwept(t *testing.T) {
	cmd, pids, _, seg, out := startShmJob(t, "swept"+strconv.Itoa(os.Getpid()))
	g := guardOf(cmd.Process.Pid)
	if g == 0 {
		t.Fatalf("slimerun (pid %d) has no guard process:\n%s", cmd.Process.Pid, out.String())
	}
	syscall.Kill(g, syscall.SIGKILL)
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	waitGone(t, pids)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	next, err := exec.CommandContext(ctx, slimerun, "--standalone", "true").CombinedOutput()
	if err != nil {
		t.Fatalf("the next job: %v\n%s", err, next)
	}
	if _, err := os.Stat(seg); !os.IsNotExist(err) {
		t.Fatalf("%s is still there after the next slimerun (%v):\n%s", seg, err, next)
	}
}

// syncWriter collects a process's output for messages.
type syncWriter struct {
	mu  sync.Mutex
	buf []byte
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	return len(p), nil
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.buf)
}

// TestStdBeyondNode: --redirects and --tee entries for local ranks this
// node does not run are ignored, as torchrun's to_map ignores them (one
// launch script for nodes of different sizes); a bad code is still
// refused.
func TestStdBeyondNode(t *testing.T) {
	got, err := parseStd("0:1,5:3", 2)
	if err != nil || len(got) != 1 || got[0] != 1 {
		t.Errorf("parseStd(0:1,5:3, 2 workers) = %v, %v; want [1] (rank 5 ignored)", got, err)
	}
	if _, err := parseStd("0:1,5:9", 2); err == nil {
		t.Error("parseStd(0:1,5:9): a bad code for an absent rank was accepted")
	}
}

// A slimerun that inherits the guard's environment variable (a guard's
// variable passed on by some program) is still slimerun: it runs the job.
func TestGuardEnvInherited(t *testing.T) {
	cmd := exec.Command(slimerun, "-q", "--standalone", "sh", "-c", "echo ran")
	cmd.Env = append(os.Environ(), "SLIME_LAUNCHER_GUARD=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "[0]: ran") {
		t.Fatalf("%v, want the job run:\n%s", err, out)
	}
}

// torchrun's documented recipe for stacked single-node jobs,
// --rdzv-backend=c10d --rdzv-endpoint=localhost:0 --nnodes=1, lets the
// store take a free port: two such jobs on one host do not meet. It was
// refused ("want host[:port]").
func TestRdzvEndpointPortZeroOneNode(t *testing.T) {
	out, err := exec.Command(slimerun, "-q", "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "--nnodes=1", "--nproc-per-node=2",
		"sh", "-c", `echo "S=$SLIME_STORE_PORT R=$TORCHELASTIC_RUN_ID"`).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(string(out), "[1]: S=") || strings.Contains(string(out), "S=0 ") || strings.Contains(string(out), "S=29400 ") {
		t.Fatalf("want both workers on a free store port:\n%s", out)
	}
	// Across nodes the others must be given node 0's port: still refused.
	out, err = exec.Command(slimerun, "-q", "--rdzv-endpoint=10.0.0.1:0", "--nnodes=2", "true").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "port 0") {
		t.Fatalf("--nnodes 2 with port 0: err %v, want exit 2 naming port 0\n%s", err, out)
	}
}

// torchrun takes each of its flags from PET_<FLAG> where the command line
// leaves it out (torch.distributed.argparse_util's env action): Kubeflow's
// PyTorchJob runs a bare `torchrun train.py` with PET_NNODES,
// PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT.
// slimerun ignored them and ran every node as a job of its own. The command
// line still wins.
func TestPETEnvironment(t *testing.T) {
	cmd := exec.Command(slimerun, "-q", "--role", "cli", "sh", "-c", `echo "W=$WORLD_SIZE L=$LOCAL_WORLD_SIZE S=$SLIME_STORE_PORT R=$ROLE_NAME"`)
	port := strconv.Itoa(testbin.FreePort(t))
	cmd.Env = append(os.Environ(), "PET_NPROC_PER_NODE=2", "PET_MASTER_PORT="+port, "PET_ROLE=env", "PET_NNODES=1", "PET_NODE_RANK=0")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "[1]: W=2 L=2 S="+port+" R=cli") {
		t.Fatalf("%v\n%s", err, out)
	}
	cmd = exec.Command(slimerun, "-q", "true")
	cmd.Env = append(os.Environ(), "PET_NNODES=x")
	out, err = cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "PET_NNODES") {
		t.Fatalf("a bad PET_NNODES: err %v, want exit 2 naming it\n%s", err, out)
	}
}

// torchrun's c10d backend gives node ranks in order of arrival, so its
// multi-node recipe runs the same command, without --node-rank, on every
// node. slimerun's c10d does not: each node took node rank 0, and on a
// host other than the master's hosted a store of its own (on its address
// that reaches the master) and waited out --rdzv-timeout (5 minutes) for
// nodes that never came. It is refused at once, saying what to give.
func TestC10dWithoutNodeRankRefused(t *testing.T) {
	cmd := exec.Command(slimerun, "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:"+strconv.Itoa(testbin.FreePort(t)), "--nnodes=2", "--rdzv-timeout=20", "true")
	cmd.Env = append(os.Environ(), "SLIME_JOB_SECRET=s")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "--node-rank") || time.Since(start) > 10*time.Second {
		t.Fatalf("err %v after %v, want exit 2 at once asking for --node-rank\n%s", err, time.Since(start).Round(time.Second), out)
	}
	// Given, it runs as before (here: node 0 of a job whose node 1 never comes).
	cmd = exec.Command(slimerun, "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:"+strconv.Itoa(testbin.FreePort(t)), "--nnodes=2", "--node-rank=0", "--rdzv-timeout=1", "true")
	cmd.Env = append(os.Environ(), "SLIME_JOB_SECRET=s")
	out, _ = cmd.CombinedOutput()
	if !strings.Contains(string(out), "did not join") {
		t.Fatalf("with --node-rank 0: want the missing node named\n%s", out)
	}
}
