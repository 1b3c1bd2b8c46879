package launcher

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/testbin"
)

// syncBuffer is a console shared by the workers' output goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func run(t *testing.T, cfg Config, script string) (string, string, error) {
	t.Helper()
	var out, errb syncBuffer
	cfg.Program, cfg.Args = "sh", []string{"-c", script}
	cfg.Stdout, cfg.Stderr = &out, &errb
	cfg.Standalone = true
	if cfg.StopGrace == 0 {
		cfg.StopGrace = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := Run(ctx, cfg)
	return out.String(), errb.String(), err
}

func TestEnvironmentAndPrefix(t *testing.T) {
	out, _, err := run(t, Config{NProcPerNode: 3, Env: []string{"PATH=" + os.Getenv("PATH")}},
		`echo "R=$RANK L=$LOCAL_RANK W=$WORLD_SIZE LW=$LOCAL_WORLD_SIZE G=$GROUP_RANK A=$MASTER_ADDR P=$MASTER_PORT OMP=$OMP_NUM_THREADS S=$SLIME_AGENT_STORE"; printf 'no newline'; echo err >&2`)
	if err != nil {
		t.Fatal(err)
	}
	for r := range 3 {
		want := "[" + string(rune('0'+r)) + "]: R=" + string(rune('0'+r)) + " L=" + string(rune('0'+r)) + " W=3 LW=3 G=0 A=127.0.0.1 P="
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
		if !strings.Contains(out, "["+string(rune('0'+r))+"]: no newline\n") {
			t.Errorf("rank %d's last partial line was not flushed:\n%s", r, out)
		}
	}
	if strings.Contains(out, "P=0 ") || !strings.Contains(out, "OMP=1 S=1") {
		t.Errorf("port, OMP_NUM_THREADS or SLIME_AGENT_STORE wrong:\n%s", out)
	}
}

func TestOMPNumThreadsKept(t *testing.T) {
	out, _, err := run(t, Config{NProcPerNode: 1, Env: []string{"PATH=" + os.Getenv("PATH"), "OMP_NUM_THREADS=7"}}, `echo OMP=$OMP_NUM_THREADS`)
	if err != nil || !strings.Contains(out, "OMP=7") {
		t.Fatalf("%v\n%s", err, out)
	}
}

// As torchrun, OMP_NUM_THREADS=1 is for several workers per node: a
// single worker keeps OpenMP's own default (every core), which
// OMP_NUM_THREADS=1 cut to one thread.
func TestOMPNumThreadsOneWorkerUnset(t *testing.T) {
	out, _, err := run(t, Config{NProcPerNode: 1, Env: []string{"PATH=" + os.Getenv("PATH")}}, `echo "OMP=${OMP_NUM_THREADS-unset}"`)
	if err != nil || !strings.Contains(out, "OMP=unset") {
		t.Fatalf("%v\n%s", err, out)
	}
}

// TestNCCLAsyncErrorHandling: as torchrun, the workers get NCCL's
// asynchronous error handling (a collective on a dead peer fails instead
// of hanging), under both the old and the new name, unless the
// environment sets it.
func TestNCCLAsyncErrorHandling(t *testing.T) {
	const show = `echo "A=${NCCL_ASYNC_ERROR_HANDLING-unset} B=${TORCH_NCCL_ASYNC_ERROR_HANDLING-unset}"`
	out, _, err := run(t, Config{NProcPerNode: 1, Env: []string{"PATH=" + os.Getenv("PATH")}}, show)
	if err != nil || !strings.Contains(out, "A=1 B=1") {
		t.Fatalf("defaults: %v\n%s", err, out)
	}
	out, _, err = run(t, Config{NProcPerNode: 1, Env: []string{"PATH=" + os.Getenv("PATH"), "NCCL_ASYNC_ERROR_HANDLING=0", "TORCH_NCCL_ASYNC_ERROR_HANDLING=3"}}, show)
	if err != nil || !strings.Contains(out, "A=0 B=3") {
		t.Fatalf("set by the user: %v\n%s", err, out)
	}
}

func TestFailureStopsOthers(t *testing.T) {
	dir := t.TempDir()
	start := time.Now()
	_, _, err := run(t, Config{NProcPerNode: 4}, `echo $$ > `+dir+`/pid.$RANK; if [ $RANK = 2 ]; then sleep 0.2; exit 7; fi; exec sleep 60`)
	var we *WorkerError
	if !errors.As(err, &we) || we.Rank != 2 || we.ExitCode != 7 {
		t.Fatalf("err = %v; want rank 2 exit 7", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("stopping took %v", d)
	}
	assertGone(t, dir, 4)
}

func TestStopEscalatesToKill(t *testing.T) {
	dir := t.TempDir()
	_, _, err := run(t, Config{NProcPerNode: 2, StopGrace: 300 * time.Millisecond},
		`echo $$ > `+dir+`/pid.$RANK; if [ $RANK = 0 ]; then sleep 0.2; kill -9 $$; fi; trap '' TERM; while :; do sleep 0.05; done`)
	var we *WorkerError
	if !errors.As(err, &we) || we.Rank != 0 || we.Signal != syscall.SIGKILL {
		t.Fatalf("err = %v; want rank 0 killed by SIGKILL", err)
	}
	assertGone(t, dir, 2)
}

// TestStopContinuesStopped: a worker stopped (SIGSTOP, a debugger's
// or a job control's) when the job fails gets SIGCONT after SIGTERM, so
// that it ends now, not at the grace's SIGKILL.
func TestStopContinuesStopped(t *testing.T) {
	dir := t.TempDir()
	start := time.Now()
	_, _, err := run(t, Config{NProcPerNode: 2, StopGrace: 30 * time.Second},
		`echo $$ > `+dir+`/pid.$RANK; if [ $RANK = 0 ]; then kill -STOP $$; exec sleep 60; fi; sleep 0.3; exit 3`)
	var we *WorkerError
	if !errors.As(err, &we) || we.Rank != 1 || we.ExitCode != 3 {
		t.Fatalf("err = %v; want rank 1 exit 3", err)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("stopping took %v: the stopped worker waited for the grace's SIGKILL", d)
	}
	assertGone(t, dir, 2)
}

func assertGone(t *testing.T, dir string, n int) {
	t.Helper()
	for r := range n {
		b, err := os.ReadFile(filepath.Join(dir, "pid."+string(rune('0'+r))))
		if err != nil {
			t.Fatal(err)
		}
		var pid int
		for _, c := range strings.TrimSpace(string(b)) {
			pid = pid*10 + int(c-'0')
		}
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("worker %d (pid %d) outlived the launcher", r, pid)
		}
	}
}

func TestRedirectsAndTee(t *testing.T) {
	dir := t.TempDir()
	out, _, err := run(t, Config{NProcPerNode: 2, LogDir: dir, RunID: "logs", Redirects: []Std{Stdout, 0}, Tee: []Std{0, Stdout | Stderr}},
		`echo out-$RANK; echo err-$RANK >&2`)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "out-0") || !strings.Contains(out, "[1]: out-1") {
		t.Errorf("console:\n%s", out)
	}
	read := func(rel string) string {
		b, err := os.ReadFile(filepath.Join(dir, "logs", "attempt_0", rel))
		if err != nil {
			t.Error(err)
		}
		return string(b)
	}
	if got := read("0/stdout.log"); got != "out-0\n" {
		t.Errorf("rank 0 stdout.log = %q", got)
	}
	if got := read("1/stdout.log"); got != "out-1\n" {
		t.Errorf("rank 1 stdout.log = %q", got)
	}
	if got := read("1/stderr.log"); got != "err-1\n" {
		t.Errorf("rank 1 stderr.log = %q", got)
	}
}

func TestMaxRestarts(t *testing.T) {
	out, _, err := run(t, Config{NProcPerNode: 2, MaxRestarts: 2},
		`echo attempt=$TORCHELASTIC_RESTART_COUNT; [ $TORCHELASTIC_RESTART_COUNT -ge 1 ] || exit 1`)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "attempt=0") || !strings.Contains(out, "attempt=1") || strings.Contains(out, "attempt=2") {
		t.Errorf("attempts:\n%s", out)
	}
	_, _, err = run(t, Config{NProcPerNode: 1, MaxRestarts: 1}, `exit 4`)
	var we *WorkerError
	if !errors.As(err, &we) || we.Attempt != 1 || we.ExitCode != 4 {
		t.Errorf("err = %v; want a failure on attempt 1", err)
	}
}

func TestBadConfig(t *testing.T) {
	cases := []Config{
		{NNodes: 2, NProcPerNode: 1, NodeRank: 0, Program: "true"},                  // no master address
		{NNodes: 1, NProcPerNode: 0, Program: "true"},                               // no workers
		{NNodes: 2, NProcPerNode: 1, NodeRank: 2, MasterAddr: "x", Program: "true"}, // node rank out of range
		{NNodes: 1, NProcPerNode: 1, Program: "/no/such/program"},
		{Standalone: true, NNodes: 2, NProcPerNode: 1, Program: "true"},   // one node, not two
		{Standalone: true, NodeRank: 1, NProcPerNode: 1, Program: "true"}, // nor node rank 1
	}
	for _, cfg := range cases {
		if err := Run(context.Background(), cfg); !errors.Is(err, ErrBadConfig) {
			t.Errorf("%+v: err = %v, want ErrBadConfig", cfg, err)
		}
	}
}

func TestMissingNodeNamed(t *testing.T) {
	var errb syncBuffer
	err := Run(context.Background(), Config{NNodes: 3, NodeRank: 0, NProcPerNode: 1, MasterAddr: "127.0.0.1", MasterPort: testbin.FreePort(t),
		RdzvTimeout: 300 * time.Millisecond, Program: "true", Stderr: &errb})
	if err == nil || !strings.Contains(err.Error(), "node rank(s) [1 2] did not join") {
		t.Fatalf("err = %v", err)
	}
}

// A worker killed by a signal is named over one that exited with an error
// a moment earlier: the exits of a dead rank's peers can be reported first.
func TestRootCausePrefersSignal(t *testing.T) {
	_, _, err := run(t, Config{NProcPerNode: 3, MonitorInterval: time.Second},
		`case $RANK in 1) sleep 0.05; exit 3;; 2) sleep 0.3; kill -9 $$;; *) exec sleep 30;; esac`)
	var we *WorkerError
	if !errors.As(err, &we) || we.Rank != 2 || we.Signal != syscall.SIGKILL {
		t.Fatalf("err = %v; want rank 2 killed by SIGKILL", err)
	}
}

// TestLogOpenFailureClosesLogs: a worker whose stderr log cannot be made
// (a directory of that name) fails the job, and the stdout log opened
// just before is closed, not leaked (the launcher may run many jobs).
func TestLogOpenFailureClosesLogs(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "logfail", "attempt_0", "0", "stderr.log"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, _, err := run(t, Config{NProcPerNode: 1, LogDir: dir, RunID: "logfail", Redirects: []Std{Stdout | Stderr}}, "true")
	if err == nil {
		t.Fatal("the job ran without its stderr log")
	}
	fds, _ := os.ReadDir("/proc/self/fd")
	for _, fd := range fds {
		if target, _ := os.Readlink("/proc/self/fd/" + fd.Name()); strings.HasPrefix(target, dir) {
			t.Errorf("descriptor %s still open on %s after the job failed (%v)", fd.Name(), target, err)
		}
	}
}

// With Config.Stdin nil a worker's standard input is /dev/null, as the
// field's doc says: not a closed descriptor 0 (which the worker's next
// open would take for its standard input).
func TestStdinNilIsDevNull(t *testing.T) {
	out, _, err := run(t, Config{NProcPerNode: 1, Env: []string{"PATH=" + os.Getenv("PATH")}}, `echo "stdin=$(readlink /proc/self/fd/0 || echo closed)"`)
	if err != nil || !strings.Contains(out, "stdin=/dev/null") {
		t.Fatalf("%v, want stdin=/dev/null:\n%s", err, out)
	}
}

// TestLogDirOfEarlierRunWarned: a run whose run id's log directory is
// there already (the same command run again: across nodes the run id
// defaults to the port) writes over the earlier run's logs; it says so
// once, naming the directory, rather than replace them without a word.
func TestLogDirOfEarlierRunWarned(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{NProcPerNode: 1, LogDir: dir, RunID: "again", Redirects: []Std{Stdout}}
	if _, stderr, err := run(t, cfg, "echo first"); err != nil || strings.Contains(stderr, "earlier run") {
		t.Fatalf("first run: %v\n%s", err, stderr)
	}
	_, stderr, err := run(t, cfg, "echo second")
	if err != nil || strings.Count(stderr, "earlier run") != 1 || !strings.Contains(stderr, filepath.Join(dir, "again")) {
		t.Fatalf("second run: %v; want one warning naming %s:\n%s", err, filepath.Join(dir, "again"), stderr)
	}
}
