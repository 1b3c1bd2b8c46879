package collective_test

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/testbin"
)

// binDir is where the commands the multi-process tests launch are built,
// once, on first use: a run of only the in-process tests (such as the CUDA
// ones on a GPU machine without Go) needs no toolchain.
func binDir(t *testing.T) string {
	t.Helper()
	dir, err := testbin.Build()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestMain builds the emulated CUDA library and points SLIME_CUDA_LIB at
// it unless the variable names a library already (gpu_test.go's setup), so
// that the CUDA tests run here; jobs it launches get SLIME_BACKEND=cpu
// unless set, since under auto they would run on the emulator (the GPU
// jobs ask for cuda themselves).
func TestMain(m *testing.M) {
	if err := useEmulator(); err != nil {
		fmt.Fprintln(os.Stderr, "collective tests:", err)
		os.Exit(1)
	}
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

type job struct {
	out    string
	code   int
	runID  string
	wall   time.Duration
	stderr string
}

// slimerun runs the job to completion (bounded by a generous timeout) and
// checks that it left nothing in /dev/shm.
func slimerun(t *testing.T, env []string, args ...string) job {
	t.Helper()
	runID := fmt.Sprintf("t%d-%d", os.Getpid(), time.Now().UnixNano()%1e9)
	full := append([]string{"--standalone", "--rdzv-id", runID}, args...)
	// The first of the project's commands named is the program to run.
	for i, a := range full {
		if a == "agcheck" || a == "slimebench" || a == "allgather" || a == "allgather_gemm" {
			full[i] = filepath.Join(binDir(t), a)
			break
		}
	}
	cmd := exec.Command(filepath.Join(binDir(t), "slimerun"), full...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(4 * time.Minute):
		cmd.Process.Signal(os.Interrupt)
		t.Fatalf("slimerun %v hung; output so far:\n%s\n%s", args, stdout.String(), stderr.String())
	}
	j := job{out: stdout.String(), stderr: stderr.String(), runID: runID, wall: time.Since(start)}
	if ee, ok := err.(*exec.ExitError); ok {
		j.code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir("/dev/shm")
	for _, e := range entries {
		if strings.Contains(e.Name(), runID) {
			t.Errorf("job left /dev/shm/%s", e.Name())
		}
	}
	return j
}

func TestAllGatherProcesses(t *testing.T) {
	for _, P := range []int{1, 2, 3, 4, 7, 8} {
		t.Run(fmt.Sprintf("P=%d", P), func(t *testing.T) {
			sizes := "0,1,7,4096,1048579"
			if P <= 4 {
				sizes += ",64M"
			}
			checkJob(t, nil, P, sizes)
		})
	}
}

// TestManyProcesses: 16 processes on 2 cores must all make progress.
func TestManyProcesses(t *testing.T) {
	j := slimerun(t, nil, "--nproc-per-node", "16", "agcheck", "--sizes", "0,7,4096,100003,1048579", "--iters", "1", "--plan-runs", "200")
	if j.code != 0 || strings.Count(j.out, "PASS rank") != 16 {
		t.Fatalf("exit %d, %d of 16 ranks passed\n%s\n%s", j.code, strings.Count(j.out, "PASS rank"), j.out, j.stderr)
	}
}

// TestStagingRing turns cross-memory attach off so that plain buffers go
// through the staging ring, with small slots that wrap many times.
func TestStagingRing(t *testing.T) {
	for _, P := range []int{2, 5} {
		t.Run(fmt.Sprintf("P=%d", P), func(t *testing.T) {
			checkJob(t, []string{"SLIME_CMA_MIN=-1", "SLIME_SLOT_BYTES=64K", "SLIME_SLOTS=2"}, P, "0,1,7,16343,16345,1048579,9M")
		})
	}
}

func checkJob(t *testing.T, env []string, P int, sizes string) {
	t.Helper()
	j := slimerun(t, env, "--nproc-per-node", strconv.Itoa(P), "agcheck", "--sizes", sizes, "--iters", "2", "--plan-runs", "1000")
	if j.code != 0 || strings.Count(j.out, "PASS rank") != P {
		t.Fatalf("exit %d, %d of %d ranks passed\nstdout:\n%s\nstderr:\n%s", j.code, strings.Count(j.out, "PASS rank"), P, j.out, j.stderr)
	}
	for r := range P {
		for _, want := range []string{"ok allgather 1048579 bytes", "ok allgatherv", "ok plan 1000 runs", "ok typed"} {
			if !strings.Contains(j.out, fmt.Sprintf("[%d]: %s", r, want)) {
				t.Errorf("rank %d did not report %q", r, want)
			}
		}
	}
}

// expectFault runs a fault scenario and checks that every surviving rank
// reported the expected error, and slimerun failed naming the first failure.
func expectFault(t *testing.T, env []string, P int, survivors []int, args ...string) job {
	t.Helper()
	// A long monitor interval lets the survivors report before slimerun
	// stops them; they must notice on their own.
	full := append([]string{"--monitor-interval", "15s", "--nproc-per-node", strconv.Itoa(P), "agcheck"}, args...)
	j := slimerun(t, env, full...)
	if j.code == 0 {
		t.Fatalf("slimerun exited 0 after a fault\n%s\n%s", j.out, j.stderr)
	}
	for _, r := range survivors {
		if !regexp.MustCompile(fmt.Sprintf(`(?m)^\[%d\]: EXPECTED rank %d: \w+ rank %d peer \d+: `, r, r, r)).MatchString(j.out) {
			t.Errorf("rank %d did not report the expected error naming rank and peer\nstdout:\n%s\nstderr:\n%s", r, j.out, j.stderr)
		}
	}
	if strings.Contains(j.out, "UNEXPECTED") {
		t.Errorf("unexpected error:\n%s", j.out)
	}
	return j
}

func TestSizeMismatchEveryRank(t *testing.T) {
	for _, n := range []string{"8", "1M"} {
		j := expectFault(t, nil, 4, []int{0, 1, 2, 3}, "--fault", "mismatch", "--fault-rank", "2", "--fault-size", n)
		if !strings.Contains(j.out, "size mismatch") {
			t.Errorf("no size mismatch reported:\n%s", j.out)
		}
		// Each rank names the peer it disagrees with: rank 2 for the
		// others; for rank 2, whom every peer disagrees with, the first
		// it checks, rank 0.
		for r := range 4 {
			peer := 2
			if r == 2 {
				peer = 0
			}
			if !regexp.MustCompile(fmt.Sprintf(`(?m)^\[%d\]: EXPECTED rank %d: \w+ rank %d peer %d: slimego: size mismatch`, r, r, r, peer)).MatchString(j.out) {
				t.Errorf("n=%s: rank %d did not name peer %d:\n%s", n, r, peer, j.out)
			}
		}
	}
}

func TestKilledRank(t *testing.T) {
	j := expectFault(t, []string{"SLIME_TIMEOUT=20"}, 4, []int{0, 1, 3}, "--fault", "kill", "--fault-rank", "2", "--fault-size", "16M")
	if !strings.Contains(j.stderr, "first failure: rank 2 (local rank 2") || !strings.Contains(j.stderr, "signal 9") {
		t.Errorf("slimerun did not name rank 2 killed by signal 9:\n%s", j.stderr)
	}
	if j.wall > 14*time.Second {
		t.Errorf("the survivors took %v to notice; the timeout is 20 s and a lost peer must be seen long before", j.wall)
	}
}

// A rank killed during overlapped AllGather+GEMM runs: every other rank's
// run fails naming a peer, no hang.
func TestKilledDuringOverlap(t *testing.T) {
	j := expectFault(t, []string{"SLIME_TIMEOUT=20"}, 3, []int{0, 2}, "--fault", "kill-overlap", "--fault-rank", "1")
	if !strings.Contains(j.stderr, "first failure: rank 1 (local rank 1") || j.wall > 14*time.Second {
		t.Errorf("took %v; slimerun said:\n%s", j.wall, j.stderr)
	}
}

func TestSlowRankTimesOut(t *testing.T) {
	j := expectFault(t, []string{"SLIME_TIMEOUT=2"}, 3, []int{0, 2}, "--fault", "slow", "--fault-rank", "1", "--fault-size", "4K")
	for _, r := range []int{0, 2} {
		if !strings.Contains(j.out, fmt.Sprintf("rank %d peer 1: slimego: timeout", r)) {
			t.Errorf("rank %d did not report a timeout naming rank 1:\n%s", r, j.out)
		}
	}
	// The first to exit is a survivor; the summary names the rank that
	// every error points at.
	if !strings.Contains(j.stderr, "rank 1 is the one the others' errors name") {
		t.Errorf("slimerun did not name rank 1 as the cause:\n%s", j.stderr)
	}
}

// worker runs agcheck directly (no launcher) with the given environment.
func worker(t *testing.T, env ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir(t), "agcheck"))
	cmd.Env = append(cleanEnv(), env...)
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	}
	return string(out), code
}

func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT":
			continue
		}
		if strings.HasPrefix(k, "SLIME_") || strings.HasPrefix(k, "OMPI_") || strings.HasPrefix(k, "PMIX_") ||
			strings.HasPrefix(k, "SLURM_") || strings.HasPrefix(k, "TORCHELASTIC_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

func TestBadEnvironment(t *testing.T) {
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	closedPort := strconv.Itoa(closed.Addr().(*net.TCPAddr).Port)
	closed.Close()
	busy, _ := net.Listen("tcp", "0.0.0.0:0")
	defer busy.Close()
	busyPort := strconv.Itoa(busy.Addr().(*net.TCPAddr).Port)
	cases := []struct {
		name string
		env  []string
		want string
	}{
		{"rank beyond world", []string{"RANK=4", "WORLD_SIZE=4", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + closedPort}, "RANK=4 is not below WORLD_SIZE=4"},
		{"no master address", []string{"RANK=1", "WORLD_SIZE=2", "MASTER_PORT=" + closedPort}, "MASTER_ADDR is not set"},
		{"unreachable master", []string{"RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + closedPort, "SLIME_TIMEOUT=1"}, "store unreachable: 127.0.0.1:" + closedPort},
		{"master port in use", []string{"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + busyPort, "SLIME_TIMEOUT=1"}, "address already in use"},
		{"bad timeout", []string{"SLIME_TIMEOUT=soon"}, "SLIME_TIMEOUT"},
		{"negative timeout", []string{"SLIME_TIMEOUT=-1"}, "SLIME_TIMEOUT"},
		{"unresolvable master", []string{"RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=no-such-host.invalid", "MASTER_PORT=" + closedPort, "SLIME_TIMEOUT=60"}, "no-such-host.invalid"},
		{"unresolvable master, rank 0", []string{"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=no-such-host.invalid", "MASTER_PORT=" + closedPort, "SLIME_TIMEOUT=60"}, "no-such-host.invalid"},
		{"bad backend", []string{"SLIME_BACKEND=tpu"}, "unknown backend"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			out, code := worker(t, tc.env...)
			if code == 0 || !strings.Contains(out, tc.want) {
				t.Errorf("exit %d, output %q; want an error containing %q", code, out, tc.want)
			}
			// Every case is final: none may wait out SLIME_TIMEOUT.
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("took %v", d)
			}
		})
	}
}

func TestLauncherPortInUse(t *testing.T) {
	busy, _ := net.Listen("tcp", "0.0.0.0:0")
	defer busy.Close()
	port := strconv.Itoa(busy.Addr().(*net.TCPAddr).Port)
	cmd := exec.Command(filepath.Join(binDir(t), "slimerun"), "--nproc-per-node", "2", "--master-port", port, filepath.Join(binDir(t), "agcheck"))
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "address already in use") || !strings.Contains(string(out), port) {
		t.Fatalf("err %v, output:\n%s", err, out)
	}
}

func TestExampleAndBenchmarkRun(t *testing.T) {
	j := slimerun(t, nil, "--nproc-per-node", "3", "allgather", "--m", "64", "--n", "33", "--iters", "20")
	if j.code != 0 || strings.Count(j.out, "all_gather check passed") != 3 {
		t.Fatalf("example: exit %d\n%s\n%s", j.code, j.out, j.stderr)
	}
	j = slimerun(t, nil, "--nproc-per-node", "2", "slimebench", "allgather", "-b", "8", "-e", "64K", "-f", "8", "--iters", "20", "--csv")
	if j.code != 0 {
		t.Fatalf("slimebench: exit %d\n%s\n%s", j.code, j.out, j.stderr)
	}
	lines := strings.Split(strings.TrimSpace(j.out), "\n")
	if len(lines) != 1+2*5 || !strings.HasSuffix(lines[0], "impl,backend,mode,P,nodes,S,median_us,algbw_GBps,busbw_GBps,wrong") {
		t.Fatalf("csv:\n%s", j.out)
	}
	for _, l := range lines[1:] {
		if !strings.HasSuffix(l, ",0") {
			t.Errorf("wrong bytes reported: %s", l)
		}
	}
	if !strings.Contains(j.stderr, "slimebench: [5/5]") {
		t.Errorf("no progress on stderr:\n%s", j.stderr)
	}
}

func TestOverlapExampleAndBenchmark(t *testing.T) {
	for _, dtype := range []string{"float32", "float64"} {
		j := slimerun(t, nil, "--nproc-per-node", "3", "allgather_gemm", "--m", "67", "--n", "45", "--k", "129", "--dtype", dtype, "--iters", "2")
		if j.code != 0 || !strings.Contains(j.out, "all_gather_gemm check passed: 3 ranks") {
			t.Fatalf("%s: exit %d\n%s\n%s", dtype, j.code, j.out, j.stderr)
		}
	}
	plot := filepath.Join(t.TempDir(), "overlap.png")
	j := slimerun(t, nil, "--nproc-per-node", "2", "slimebench", "overlap", "--m-min", "16", "--m-max", "64", "--nk", "64", "--iters", "2", "--cpu-window", "50ms", "--csv", "--plot", plot)
	if j.code != 0 {
		t.Fatalf("slimebench overlap: exit %d\n%s\n%s", j.code, j.out, j.stderr)
	}
	lines := strings.Split(strings.TrimSpace(j.out), "\n")
	if len(lines) != 4 || !strings.HasSuffix(lines[0], "impl,backend,mode,P,m,n,k,dtype,t_comm_us,t_gemm_us,t_seq_us,t_overlap_us,efficiency") {
		t.Fatalf("csv:\n%s", j.out)
	}
	if st, err := os.Stat(plot); err != nil || st.Size() < 1000 {
		t.Fatalf("plot: %v", err)
	}
	// The table adds how busy the gather and the GEMMs keep the machine.
	j = slimerun(t, nil, "--nproc-per-node", "2", "slimebench", "overlap", "--m-min", "32", "--m-max", "32", "--nk", "64", "--iters", "2", "--cpu-window", "100ms")
	row := regexp.MustCompile(`(?m)^\[0\]:\s+32\s+64\s+64\s+float32\s+4(\s+-?[0-9.]+){5}\s+(0\.\d\d|1\.00)\s+(0\.\d\d|1\.00)( \*)?$`) // * : the efficiency is mostly noise
	if j.code != 0 || !strings.Contains(j.out, "cpu_comm") || !row.MatchString(j.out) {
		t.Fatalf("slimebench overlap table: exit %d\n%s\n%s", j.code, j.out, j.stderr)
	}
}
