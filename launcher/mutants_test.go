package launcher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/shm"
	"github.com/slimego/slimego/rendezvous"
)

// logLines collects what a Run reports through Logf.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logf(format string, a ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, a...))
}

func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// TestPrefixWriterLines: the console gets each whole line once behind the
// rank's prefix, an empty line included; a partial line waits for its end
// up to 64 KiB (exactly 64 KiB still waits), a longer one is emitted, and
// flush ends what is pending and adds nothing when nothing is.
func TestPrefixWriterLines(t *testing.T) {
	big := strings.Repeat("a", 64<<10)
	for _, tc := range []struct {
		name   string
		writes []string
		want   string
	}{
		{"lines", []string{"x\ny\n"}, "[0]: x\n[0]: y\n"},
		{"an empty line", []string{"x\n\ny\n"}, "[0]: x\n[0]: \n[0]: y\n"},
		{"an empty line first", []string{"\n", "z\n"}, "[0]: \n[0]: z\n"},
		{"a line in pieces", []string{"ab", "c", "d\n"}, "[0]: abcd\n"},
		{"a partial line flushed", []string{"x\nrest"}, "[0]: x\n[0]: rest\n"},
		{"nothing pending at flush", []string{"x\n"}, "[0]: x\n"},
		{"nothing at all", nil, ""},
		{"64 KiB waits for its end", []string{big, "b\n"}, "[0]: " + big + "b\n"},
		{"over 64 KiB is emitted", []string{big + "a", "b\n"}, "[0]: " + big + "a\n[0]: b\n"},
	} {
		var out bytes.Buffer
		p := &prefixWriter{con: new(console), out: &out, prefix: "[0]: "}
		for _, w := range tc.writes {
			if n, err := p.Write([]byte(w)); n != len(w) || err != nil {
				t.Errorf("%s: Write = %d, %v; want %d, nil", tc.name, n, err, len(w))
			}
		}
		p.flush()
		if got := out.String(); got != tc.want {
			if len(got) > 200 || len(tc.want) > 200 {
				t.Errorf("%s: console got %d bytes (%d lines), want %d (%d lines)", tc.name, len(got), strings.Count(got, "\n"), len(tc.want), strings.Count(tc.want, "\n"))
			} else {
				t.Errorf("%s: console got %q, want %q", tc.name, got, tc.want)
			}
		}
	}
}

// TestPrefixWriterCarriageReturn: a progress bar (tqdm: "\r 10%|..."
// rewritten in place, no newline until the loop ends) reaches the console
// as it goes, each update behind the prefix; it was held until its
// newline (a whole epoch) or 64 KiB. "\r\n" still ends one line.
func TestPrefixWriterCarriageReturn(t *testing.T) {
	var out bytes.Buffer
	p := &prefixWriter{con: new(console), out: &out, prefix: "[0]: "}
	for _, w := range []string{"\r 10%|#", "\r 20%|##", "\r 30%|###"} {
		p.Write([]byte(w))
	}
	if got, want := out.String(), "[0]:  10%|#\r[0]:  20%|##\r"; got != want {
		t.Fatalf("before the bar's end the console got %q, want %q", got, want)
	}
	p.Write([]byte("\n"))
	p.Write([]byte("dos line\r\n"))
	p.flush()
	if got, want := out.String(), "[0]:  10%|#\r[0]:  20%|##\r[0]:  30%|###\n[0]: dos line\r\n"; got != want {
		t.Fatalf("console got %q, want %q", got, want)
	}
}

// TestLookupEnv: the last assignment of a key wins, the first entry is
// looked at too, and an entry without '=' is skipped (not a crash).
func TestLookupEnv(t *testing.T) {
	for _, tc := range []struct {
		env      []string
		key      string
		want     string
		wantSeen bool
	}{
		{[]string{"A=1", "B=2"}, "A", "1", true},
		{[]string{"A=1"}, "A", "1", true},
		{[]string{"A=1", "A=2"}, "A", "2", true},
		{[]string{"A="}, "A", "", true},
		{[]string{"A=x=y"}, "A", "x=y", true},
		{[]string{"NOEQUALS", "A=1"}, "NOEQUALS", "", false},
		{[]string{"B=1"}, "A", "", false},
		{nil, "A", "", false},
	} {
		got, ok := lookupEnv(tc.env, tc.key)
		if got != tc.want || ok != tc.wantSeen {
			t.Errorf("lookupEnv(%q, %q) = %q, %v; want %q, %v", tc.env, tc.key, got, ok, tc.want, tc.wantSeen)
		}
	}
}

// TestSummarize: what became of the blamed rank comes from its own worker
// only (not from the others'), and a group of one failed rank says "rank",
// of several "ranks".
func TestSummarize(t *testing.T) {
	j := &job{cfg: &Config{NNodes: 1, NProcPerNode: 4}}
	code1 := func(r int) *WorkerError { return &WorkerError{Rank: r, ExitCode: 1} }
	killed := &WorkerError{Rank: 2, ExitCode: -1, Signal: syscall.SIGKILL}
	for _, tc := range []struct {
		name     string
		blamed   int
		failures []*WorkerError
		workers  []*worker
		want     string
	}{
		{"blamed did not exit, the rank before it exited 0", 2, []*WorkerError{code1(0)},
			[]*worker{{rank: 0}, {rank: 1, cleanExit: true}, {rank: 2}, nil},
			"rank 2 did not exit; rank 0 exited with code 1"},
		{"blamed exited 0, the others did not", 0, []*WorkerError{code1(1)},
			[]*worker{{rank: 0, cleanExit: true}, {rank: 1}, {rank: 2}, nil},
			"rank 0 exited with code 0; rank 1 exited with code 1"},
		{"groups of one and of two", 3, []*WorkerError{code1(1), killed, code1(0)},
			[]*worker{nil, nil, nil, {rank: 3}},
			"rank 3 did not exit; ranks 0,1 exited with code 1; rank 2 was killed by signal 9 (killed)"},
		{"the blamed rank failed", 1, []*WorkerError{code1(1), code1(0)},
			nil,
			"rank 1 exited with code 1; rank 0 exited with code 1"},
	} {
		if got := j.summarize(tc.blamed, tc.failures, tc.workers); got != tc.want {
			t.Errorf("%s: summary %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestFailureWithoutBlame: when no worker blames anyone, the job's error
// blames no rank (Blamed -1) and says only what failed first.
func TestFailureWithoutBlame(t *testing.T) {
	_, _, err := run(t, Config{NProcPerNode: 1}, `exit 3`)
	var je *JobError
	if !errors.As(err, &je) {
		t.Fatalf("err = %v, want a *JobError", err)
	}
	if je.Blamed != -1 || je.Summary != "" || !strings.HasPrefix(err.Error(), "first failure: rank 0 (local rank 0, pid ") || !strings.HasSuffix(err.Error(), "exited with code 3") {
		t.Errorf("blamed %d (%q), err %q; want -1 and only the first failure", je.Blamed, je.Summary, err)
	}
}

// TestStartFailure: on node 1 of two, a worker that cannot be started
// (its log directory cannot be made) fails the node's share with that
// error, after the workers already started are stopped; it is not a
// success. The attempt's store waits are aborted at once, naming the
// global rank that did not start (node 1's second: rank 3), and node 0
// stops its workers and fails, naming it too (TestOtherNodeFailureStopsWorkers).
func TestStartFailure(t *testing.T) {
	dir := t.TempDir()
	notDir := filepath.Join(dir, "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	port, secret := freeTCPPort(t, "127.0.0.1"), "start-secret"
	runID := "start" + strconv.Itoa(os.Getpid())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Node 0's workers end once dir/end exists. On node 1 the first
	// worker writes no log, the second's stdout goes to a log under a file.
	errs := make([]chan error, 2)
	var outs [2]syncBuffer
	for node := range 2 {
		errs[node] = make(chan error, 1)
		cfg := Config{NNodes: 2, NodeRank: node, NProcPerNode: 2, MasterAddr: "127.0.0.1", MasterPort: port,
			RunID: runID, JobSecret: []byte(secret), RdzvTimeout: 10 * time.Second, StopGrace: time.Second,
			Program: "sh", Args: []string{"-c", `while [ ! -e ` + dir + `/end ]; do sleep 0.01; done`}, Stdout: &outs[node], Stderr: &outs[node]}
		if node == 1 {
			cfg.LogDir, cfg.Redirects = notDir, []Std{0, Stdout}
		}
		go func() { errs[node] <- Run(ctx, cfg) }()
	}
	result := func(node int) error {
		select {
		case err := <-errs[node]:
			return err
		case <-time.After(30 * time.Second):
			return fmt.Errorf("node %d did not end within 30 s", node)
		}
	}
	ended := false
	defer func() {
		os.WriteFile(filepath.Join(dir, "end"), nil, 0o600)
		if !ended {
			result(0)
			result(1)
		}
	}()
	st, err := dialStore(t, port, secret, runID)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	gctx, gcancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = st.Get(gctx, rendezvous.AttemptPrefix(runID, 0)+"never")
	gcancel()
	var ae *rendezvous.AbortError
	if !errors.As(err, &ae) || ae.Rank != 3 || !strings.Contains(ae.Reason, "launcher: log dir") {
		t.Errorf("a waiter got %v; want an *AbortError naming rank 3 and its log directory", err)
	}
	err1 := result(1)
	if err1 == nil || !strings.Contains(err1.Error(), "launcher: log dir") {
		t.Errorf("node 1: err = %v; want the log directory's error", err1)
	}
	st.Close()
	os.WriteFile(filepath.Join(dir, "end"), nil, 0o600)
	err0 := result(0)
	ended = true
	var re *RemoteError
	if !errors.As(err0, &re) || re.Rank != 3 || re.Node != 1 || !strings.Contains(err0.Error(), "launcher: log dir") {
		t.Errorf("node 0: err = %v; want node 1's rank 3 named, with its log directory's error", err0)
	}
}

// TestCleanupLogged: the launcher reports the shared-memory segments it
// removes, those a failed attempt's workers left (under the job's prefix)
// and orphans of killed jobs (swept at start), names them, and reports
// nothing when there is nothing (no "removed 0"); a restart is counted
// from 1.
func TestCleanupLogged(t *testing.T) {
	runID := "mutclean" + strconv.Itoa(os.Getpid())
	left := shm.JobPrefix(runID) + "left"
	t.Cleanup(func() { os.Remove(filepath.Join(shm.Dir, left)) })
	var logs logLines
	_, _, err := run(t, Config{NProcPerNode: 1, RunID: runID, MaxRestarts: 1, Logf: logs.logf},
		`if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then : > `+shm.Dir+`/`+left+`; exit 1; fi`)
	if err != nil {
		t.Fatalf("%v\n%s", err, logs.String())
	}
	got := logs.String()
	for _, want := range []string{
		"removed 1 shared-memory segment(s) the workers left: [" + left + "]",
		"restarting the workers (1 of 1 restarts)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the log lacks %q:\n%s", want, got)
		}
	}
	// No orphans were planted: whether or not another job's turned up,
	// none is reported as "removed 0".
	for _, not := range []string{"removed 0 ", "sweeping orphaned shared memory"} {
		if strings.Contains(got, not) {
			t.Errorf("the log says %q with nothing to say:\n%s", not, got)
		}
	}
	if _, err := os.Stat(filepath.Join(shm.Dir, left)); err == nil {
		t.Errorf("%s was not removed", left)
	}

	// An orphan: a name tagged with this process's pid but another start
	// time, as a process that has gone and whose pid was reused. Another
	// test binary's launcher may sweep it first: a job that misses it is
	// tried again, up to 3 times.
	var swept string
	for try := range 3 {
		orphan := fmt.Sprintf("%smutorphan%d-o%d.1-abc%d", shm.Prefix, os.Getpid(), os.Getpid(), try)
		if err := os.WriteFile(filepath.Join(shm.Dir, orphan), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		var again logLines
		_, _, err := run(t, Config{NProcPerNode: 1, RunID: runID, Logf: again.logf}, `true`)
		os.Remove(filepath.Join(shm.Dir, orphan))
		if err != nil {
			t.Fatal(err)
		}
		swept = again.String()
		if strings.Contains(swept, "that killed jobs left: [") && strings.Contains(swept, orphan) {
			return
		}
	}
	t.Errorf("3 jobs did not report the orphan each found; the last logged:\n%s", swept)
}

// hostIP is an IPv4 address of this host other than loopback.
func hostIP(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() && !ipn.IP.IsLinkLocalUnicast() {
			return ipn.IP.String()
		}
	}
	t.Skip("this host has no IPv4 address but loopback")
	return ""
}

// TestOneNodeWorkersGetLoopback: a job on one node gives its workers
// MASTER_ADDR 127.0.0.1 whatever master address it was given.
func TestOneNodeWorkersGetLoopback(t *testing.T) {
	out, _, err := run(t, Config{NProcPerNode: 1, MasterAddr: "127.0.0.2"}, `echo A=$MASTER_ADDR`)
	if err != nil || !strings.Contains(out, "[0]: A=127.0.0.1\n") {
		t.Fatalf("err %v; want MASTER_ADDR=127.0.0.1:\n%s", err, out)
	}
}

// TestTwoNodesOnHostAddress: two nodes whose master is a non-loopback
// address of this host. Node 0 hosts its store on that address, where
// node 1 (and a client) reach it; the workers get it as MASTER_ADDR and,
// without a job secret, no SLIME_JOB_SECRET at all. When node 1's worker
// fails, node 1 tells node 0's store (a waiter fails at once, naming rank
// 1), says nothing of failing to, and reads the blame recorded there;
// node 0 stops its worker and fails, naming rank 1.
func TestTwoNodesOnHostAddress(t *testing.T) {
	ip := hostIP(t)
	dir := t.TempDir()
	port := freeTCPPort(t, ip)
	runID := "twohost" + strconv.Itoa(os.Getpid())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Rank 1 (node 1) exits 1 once dir/fail exists, rank 0 exits 0 once
	// dir/end does.
	script := `echo "A=$MASTER_ADDR S=${SLIME_JOB_SECRET+set}"; f=` + dir + `/end; c=0; [ $RANK = 1 ] && f=` + dir + `/fail && c=1; ` +
		`while [ ! -e $f ]; do sleep 0.01; done; exit $c`
	errs := make([]chan error, 2)
	var outs [2]syncBuffer
	var logs [2]logLines
	for node := range 2 {
		errs[node] = make(chan error, 1)
		go func() {
			errs[node] <- Run(ctx, Config{NNodes: 2, NodeRank: node, NProcPerNode: 1, MasterAddr: ip, MasterPort: port,
				RunID: runID, RdzvTimeout: 5 * time.Second, StopGrace: time.Second, Env: []string{"PATH=" + os.Getenv("PATH")},
				Program: "sh", Args: []string{"-c", script}, Stdout: &outs[node], Stderr: &outs[node], Logf: logs[node].logf})
		}()
	}
	ended := [2]bool{}
	result := func(node int) error {
		select {
		case err := <-errs[node]:
			ended[node] = true
			return err
		case <-time.After(30 * time.Second):
			return fmt.Errorf("node %d did not end within 30 s", node)
		}
	}
	defer func() {
		os.WriteFile(filepath.Join(dir, "fail"), nil, 0o600)
		os.WriteFile(filepath.Join(dir, "end"), nil, 0o600)
		for node := range 2 {
			if !ended[node] {
				result(node)
			}
		}
	}()
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	defer dcancel()
	st, err := rendezvous.Dial(dctx, net.JoinHostPort(ip, strconv.Itoa(port)), rendezvous.Auth{Job: runID})
	if err != nil {
		t.Fatalf("node 0's store is not on %s: %v", ip, err)
	}
	defer st.Close()
	if err := st.Wait(dctx, "slimerun/"+runID+"/nodes/0", "slimerun/"+runID+"/nodes/1"); err != nil {
		t.Fatalf("the nodes did not join: %v\nnode 1: %s", err, logs[1].String())
	}
	// Rank 1 blames rank 0.
	if err := st.Set(dctx, BlameKey(runID, 0, 1), []byte("0")); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := st.Get(ctx, rendezvous.AttemptPrefix(runID, 0)+"never")
		got <- err
	}()
	os.WriteFile(filepath.Join(dir, "fail"), nil, 0o600)
	select {
	case err := <-got:
		var ae *rendezvous.AbortError
		if !errors.As(err, &ae) || ae.Rank != 1 {
			t.Errorf("the waiter got %v; want an *AbortError naming rank 1", err)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("the waiter still waits 10 s after rank 1 failed")
	}
	err1 := result(1)
	var je *JobError
	if !errors.As(err1, &je) || je.First.Rank != 1 || je.Blamed != 0 || je.Summary != "rank 0 is on node 0; rank 1 exited with code 1" {
		t.Errorf("node 1: err = %v; want rank 1's exit, blaming rank 0 on node 0", err1)
	}
	st.Close()
	os.WriteFile(filepath.Join(dir, "end"), nil, 0o600)
	var re *RemoteError
	if err := result(0); !errors.As(err, &re) || re.Rank != 1 || !strings.Contains(err.Error(), "rank 1 (pid") {
		t.Errorf("node 0: err = %v; want rank 1's failure named", err)
	}
	for node := range 2 {
		if want := "[" + strconv.Itoa(node) + "]: A=" + ip + " S=\n"; !strings.Contains(outs[node].String(), want) {
			t.Errorf("node %d's worker printed\n%s\nwant %q", node, outs[node].String(), want)
		}
		if l := logs[node].String(); strings.Contains(l, "could not tell the store") {
			t.Errorf("node %d: %s", node, l)
		}
	}
}

// freeTCPPort is a TCP port free on host a moment ago.
func freeTCPPort(t *testing.T, host string) int {
	t.Helper()
	p, err := freePort(host)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestBlamedRankExitedZero: a blamed rank that exited 0 before its peers
// failed is said to have exited with code 0, not to be still running.
func TestBlamedRankExitedZero(t *testing.T) {
	dir := t.TempDir()
	port, secret := freeTCPPort(t, "127.0.0.1"), "zero-secret"
	runID := "zero" + strconv.Itoa(os.Getpid())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Rank 2 exits 0 once dir/go exists; ranks 0 and 1 exit 1 once
	// dir/fail does.
	script := `f=` + dir + `/fail; c=1; [ $RANK = 2 ] && f=` + dir + `/go && c=0; while [ ! -e $f ]; do sleep 0.01; done; exit $c`
	ch := make(chan error, 1)
	var out syncBuffer
	go func() {
		ch <- Run(ctx, Config{Standalone: true, NProcPerNode: 3, MasterPort: port, RunID: runID, JobSecret: []byte(secret),
			MonitorInterval: time.Second, StopGrace: time.Second, Program: "sh", Args: []string{"-c", script}, Stdout: &out, Stderr: &out})
	}()
	ended := false
	defer func() {
		os.WriteFile(filepath.Join(dir, "go"), nil, 0o600)
		os.WriteFile(filepath.Join(dir, "fail"), nil, 0o600)
		if !ended {
			select {
			case <-ch:
			case <-time.After(30 * time.Second):
			}
		}
	}()
	st, err := dialStore(t, port, secret, runID)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, r := range []int{0, 1} {
		if err := st.Set(ctx, BlameKey(runID, 0, r), []byte("2")); err != nil {
			t.Fatal(err)
		}
	}
	// Rank 2's exit has been handled once its abort reaches a waiter.
	got := make(chan error, 1)
	go func() {
		_, err := st.Get(ctx, rendezvous.AttemptPrefix(runID, 0)+"never")
		got <- err
	}()
	os.WriteFile(filepath.Join(dir, "go"), nil, 0o600)
	select {
	case err := <-got:
		var ae *rendezvous.AbortError
		if !errors.As(err, &ae) || ae.Rank != 2 {
			t.Fatalf("the waiter got %v; want an *AbortError naming rank 2", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter still waits 10 s after rank 2 exited")
	}
	os.WriteFile(filepath.Join(dir, "fail"), nil, 0o600)
	select {
	case err = <-ch:
		ended = true
	case <-time.After(30 * time.Second):
		t.Fatal("the job did not end within 30 s")
	}
	var je *JobError
	if !errors.As(err, &je) || je.Blamed != 2 || !strings.HasPrefix(je.Summary, "rank 2 exited with code 0; rank") {
		t.Fatalf("err = %v; want rank 2 blamed, which exited with code 0\n%s", err, out.String())
	}
}
