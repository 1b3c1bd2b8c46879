package launcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/slimego/slimego/internal/machine"
	"github.com/slimego/slimego/rendezvous"
)

// node is one launcher of a test job across nodes on loopback.
type node struct {
	NNodes, NodeRank, NProc int
	Rdzv                    time.Duration
}

// startNode starts node n of job runID (store on port) in the background;
// its workers run script. The channel yields Run's error.
func startNode(ctx context.Context, port int, runID string, n node, script string, out *syncBuffer) chan error {
	ch := make(chan error, 1)
	go func() {
		ch <- Run(ctx, Config{NNodes: n.NNodes, NodeRank: n.NodeRank, NProcPerNode: n.NProc, MasterAddr: "127.0.0.1", MasterPort: port,
			RunID: runID, JobSecret: []byte("nodes-secret"), RdzvTimeout: n.Rdzv, StopGrace: time.Second,
			Program: "sh", Args: []string{"-c", script}, Stdout: out, Stderr: out})
	}()
	return ch
}

// startTwoNodes starts the launchers of a job of two nodes of one worker each
// (a shell running script) in the background, on a free port, and returns
// the channels that yield their Runs' errors. tune(n, &cfg) changes node
// n's Config from the common one (20 s rendezvous timeout, 1 s stop
// grace); the context it returns, where not nil, is node n's Run's.
func startTwoNodes(ctx context.Context, t *testing.T, runID, script string, outs *[2]syncBuffer, tune func(n int, c *Config) context.Context) [2]chan error {
	t.Helper()
	port := freeTCPPort(t, "127.0.0.1")
	var chs [2]chan error
	for n := range 2 {
		cfg := Config{NNodes: 2, NodeRank: n, NProcPerNode: 1, MasterAddr: "127.0.0.1", MasterPort: port,
			RunID: runID, JobSecret: []byte("nodes-secret"), RdzvTimeout: 20 * time.Second, StopGrace: time.Second,
			Program: "sh", Args: []string{"-c", script}, Stdout: &outs[n], Stderr: &outs[n]}
		c := ctx
		if tune != nil {
			if tc := tune(n, &cfg); tc != nil {
				c = tc
			}
		}
		chs[n] = make(chan error, 1)
		go func() { chs[n] <- Run(c, cfg) }()
	}
	return chs
}

// result waits (bounded) for a node's Run to return.
func result(ch chan error, what string) error {
	select {
	case err := <-ch:
		return err
	case <-time.After(30 * time.Second):
		return fmt.Errorf("%s did not end within 30 s", what)
	}
}

// TestNodeMismatchRefused: nodes given different --nnodes or
// --nproc-per-node fail at the node barrier, each naming what every side
// was given, instead of the smaller count's nodes passing the barrier and
// their workers waiting for ranks that never come (or the others waiting
// out their rendezvous timeout). The node that sees the mismatch aborts
// the store's rendezvous, so node 0 fails at once too: neither error is a
// timeout ("did not join").
func TestNodeMismatchRefused(t *testing.T) {
	cases := []struct {
		name   string
		n0, n1 node
		want   []string // in both errors
	}{
		{"more nodes", node{2, 0, 2, 0}, node{3, 1, 2, 0}, []string{"--nnodes 3", "--nnodes 2", "node 0", "node 1"}},
		{"fewer nodes", node{3, 0, 2, 0}, node{2, 1, 2, 0}, []string{"--nnodes 2", "--nnodes 3", "node 0", "node 1"}},
		{"nproc", node{2, 0, 2, 0}, node{2, 1, 1, 0}, []string{"--nproc-per-node 1", "--nproc-per-node 2", "node 0", "node 1"}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			port := freeTCPPort(t, "127.0.0.1")
			runID := "mismatch" + strconv.Itoa(i) + "-" + strconv.Itoa(os.Getpid())
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			c.n0.Rdzv, c.n1.Rdzv = 6*time.Second, 6*time.Second
			var outs [2]syncBuffer
			ch0 := startNode(ctx, port, runID, c.n0, "true", &outs[0])
			ch1 := startNode(ctx, port, runID, c.n1, "true", &outs[1])
			for n, ch := range []chan error{ch0, ch1} {
				err := result(ch, "node "+strconv.Itoa(n))
				t.Logf("node %d: %v", n, err)
				if err == nil {
					t.Errorf("node %d: the job ran; want a refusal\n%s", n, outs[n].String())
					continue
				}
				for _, w := range c.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("node %d: err = %v\nwant it to say %q", n, err, w)
					}
				}
				if strings.Contains(err.Error(), "did not join") {
					t.Errorf("node %d waited out its rendezvous timeout: %v", n, err)
				}
				if strings.Contains(outs[n].String(), "[") {
					t.Errorf("node %d's workers ran:\n%s", n, outs[n].String())
				}
			}
		})
	}
}

// TestRestartsMismatchRefused: nodes given different --max-restarts fail
// at the rendezvous, each naming both counts. Else, after a failure, the
// node allowed a restart started its workers again alone and waited for
// the other node's ranks, which never came (or, its own ranks done,
// ended with success a job whose other node had failed).
func TestRestartsMismatchRefused(t *testing.T) {
	runID := "restarts-" + strconv.Itoa(os.Getpid())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var outs [2]syncBuffer
	chs := startTwoNodes(ctx, t, runID, "exit 3", &outs, func(n int, c *Config) context.Context {
		c.MaxRestarts, c.RdzvTimeout = 1-n, 6*time.Second
		return nil
	})
	for n, ch := range chs {
		err := result(ch, "node "+strconv.Itoa(n))
		t.Logf("node %d: %v", n, err)
		if err == nil || !strings.Contains(err.Error(), "--max-restarts 1") || !strings.Contains(err.Error(), "--max-restarts 0") {
			t.Errorf("node %d: err = %v\nwant a refusal naming both --max-restarts", n, err)
			continue
		}
		if strings.Contains(err.Error(), "did not join") {
			t.Errorf("node %d waited out its rendezvous timeout: %v", n, err)
		}
		if strings.Contains(outs[n].String(), "restarting") {
			t.Errorf("node %d restarted:\n%s", n, outs[n].String())
		}
	}
}

// TestDuplicateNodeRank: a second launcher that claims a node rank
// already taken fails at once, naming the rank and the host and pid of
// the launcher that holds it; it does not abort the job of the first,
// which runs to its end.
func TestDuplicateNodeRank(t *testing.T) {
	dir := t.TempDir()
	port := freeTCPPort(t, "127.0.0.1")
	runID := "dup" + strconv.Itoa(os.Getpid())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	script := `while [ ! -e ` + dir + `/end ]; do sleep 0.01; done`
	var outs [3]syncBuffer
	ch0 := startNode(ctx, port, runID, node{2, 0, 1, 8 * time.Second}, script, &outs[0])
	ch1 := startNode(ctx, port, runID, node{2, 1, 1, 8 * time.Second}, script, &outs[1])
	ended := false
	defer func() {
		os.WriteFile(filepath.Join(dir, "end"), nil, 0o600)
		if !ended {
			result(ch0, "node 0")
			result(ch1, "node 1")
		}
	}()
	st, err := dialStore(t, port, "nodes-secret", runID)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	err = st.Wait(wctx, "slimerun/"+runID+"/nodes/0", "slimerun/"+runID+"/nodes/1")
	wcancel()
	if err != nil {
		t.Fatalf("the nodes did not join: %v", err)
	}
	host, _ := os.Hostname()
	err = result(startNode(ctx, port, runID, node{2, 1, 1, 8 * time.Second}, script, &outs[2]), "the second node 1")
	want := fmt.Sprintf("node rank 1 is already taken by host %s, pid %d", host, os.Getpid())
	if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "did not join") {
		t.Errorf("the second node 1: err = %v; want it to say %q", err, want)
	}
	if strings.Contains(outs[2].String(), "[1]:") {
		t.Errorf("the second node 1's worker ran:\n%s", outs[2].String())
	}
	t.Log(err)
	st.Close() // node 0's store serves until its clients hang up
	os.WriteFile(filepath.Join(dir, "end"), nil, 0o600)
	for n, ch := range []chan error{ch0, ch1} {
		if err := result(ch, "node "+strconv.Itoa(n)); err != nil {
			t.Errorf("node %d of the first job: %v", n, err)
		}
	}
	ended = true
}

// TestGivingUpNodeAbortsOthers: a node that gives up the rendezvous (its
// own, shorter timeout ran out waiting for node 2) aborts the store's
// rendezvous, so that node 0 fails at once, saying why, rather than at
// its own timeout with no word of node 1.
func TestGivingUpNodeAbortsOthers(t *testing.T) {
	port := freeTCPPort(t, "127.0.0.1")
	runID := "giveup" + strconv.Itoa(os.Getpid())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var outs [2]syncBuffer
	ch0 := startNode(ctx, port, runID, node{3, 0, 1, 8 * time.Second}, "true", &outs[0])
	ch1 := startNode(ctx, port, runID, node{3, 1, 1, 500 * time.Millisecond}, "true", &outs[1])
	err1 := result(ch1, "node 1")
	if err1 == nil || !strings.Contains(err1.Error(), "node rank(s) [2] did not join") {
		t.Errorf("node 1: err = %v; want node 2 named missing", err1)
	}
	err0 := result(ch0, "node 0")
	t.Logf("node 0: %v\nnode 1: %v", err0, err1)
	var ae *rendezvous.AbortError
	if !errors.As(err0, &ae) || !strings.Contains(err0.Error(), "node 1 gave up") || !strings.Contains(err0.Error(), "node rank(s) [2] did not join") {
		t.Errorf("node 0: err = %v; want node 1's abort, naming node 2", err0)
	}
}

// FuzzParseNodeInfo: a node's claim read from the store decodes to
// counts of at least 1 and fields without spaces, and encodes back to the
// same.
func FuzzParseNodeInfo(f *testing.F) {
	f.Add([]byte("nnodes=2 nproc=4 host=vm addr=10.0.0.2 pid=123"))
	f.Add([]byte("nnodes=2 nproc=4"))
	f.Add([]byte("nnodes=2 nproc=4 host=a=b extra=1"))
	f.Add([]byte("nnodes=x"))
	f.Add([]byte("nnodes=2 nproc=4 restarts=3 host=vm"))
	f.Add([]byte("nnodes=2 nproc=4 restarts=-1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := parseNodeInfo(b)
		if err != nil {
			return
		}
		if n.NNodes < 1 || n.NProcPerNode < 1 || strings.ContainsFunc(n.Host+n.Addr+n.Machine, unicode.IsSpace) {
			t.Fatalf("%q decoded to %+v", b, n)
		}
		if back, err := parseNodeInfo(n.encode()); err != nil || back != n {
			t.Fatalf("%+v does not round-trip: %+v, %v", n, back, err)
		}
	})
}

// TestDeadClaimTakenOver: a node rank claimed by a launcher of this
// machine whose process has exited (killed during the rendezvous, then
// started again) is taken over, and the job runs; a live holder's claim
// is refused (TestDuplicateNodeRank).
func TestDeadClaimTakenOver(t *testing.T) {
	port := freeTCPPort(t, "127.0.0.1")
	runID := "dead" + strconv.Itoa(os.Getpid())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var outs [2]syncBuffer
	ch0 := startNode(ctx, port, runID, node{2, 0, 1, 8 * time.Second}, "true", &outs[0])
	st, err := dialStore(t, port, "nodes-secret", runID)
	if err != nil {
		t.Fatal(err)
	}
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	gone := nodeInfo{NNodes: 2, NProcPerNode: 1, Host: host, Addr: "127.0.0.1", Pid: dead.Process.Pid, Machine: machine.PIDSpace()}
	if _, ok, err := st.CompareAndSet(ctx, claimKey(runID, 1), nil, gone.encode()); err != nil || !ok {
		t.Fatalf("planting the dead launcher's claim: %v %v", ok, err)
	}
	st.Close()
	if err := result(startNode(ctx, port, runID, node{2, 1, 1, 8 * time.Second}, "true", &outs[1]), "node 1"); err != nil {
		t.Errorf("node 1, its rank's holder dead: %v\n%s", err, outs[1].String())
	}
	if err := result(ch0, "node 0"); err != nil {
		t.Errorf("node 0: %v", err)
	}
}

// TestOtherNodeFailureStopsWorkers: when a worker fails on one node, the
// other nodes' launchers stop their own workers (SIGTERM, with SIGCONT for
// a stopped one) and fail, naming the rank that failed, as the failed
// worker's own node stops its other workers. A worker that never returns
// to the job (stuck outside any collective call, or stopped) otherwise
// kept its launcher, and itself, running for good after every other node
// had failed and gone.
func TestOtherNodeFailureStopsWorkers(t *testing.T) {
	for i, tc := range []struct{ name, stuck string }{
		{"stuck", "exec sleep 60"},
		{"stopped", "kill -STOP $$; exec sleep 60"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port := freeTCPPort(t, "127.0.0.1")
			runID := "remote" + strconv.Itoa(i) + "-" + strconv.Itoa(os.Getpid())
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var outs [2]syncBuffer
			start := time.Now()
			ch1 := startNode(ctx, port, runID, node{2, 1, 1, 8 * time.Second}, tc.stuck, &outs[1])
			ch0 := startNode(ctx, port, runID, node{2, 0, 1, 8 * time.Second}, "sleep 0.5; exit 3", &outs[0])
			err0 := result(ch0, "node 0")
			var we *WorkerError
			if !errors.As(err0, &we) || we.Rank != 0 || we.ExitCode != 3 {
				t.Errorf("node 0: err = %v; want rank 0's exit 3", err0)
			}
			err1 := result(ch1, "node 1")
			took := time.Since(start)
			t.Logf("node 0: %v\nnode 1 (after %v): %v", err0, took.Round(time.Millisecond), err1)
			if err1 == nil || !strings.Contains(err1.Error(), "rank 0") || !strings.Contains(err1.Error(), "exited with code 3") {
				t.Errorf("node 1: err = %v; want it to name rank 0's exit 3", err1)
			}
			if took > 15*time.Second {
				t.Errorf("node 1 ended %v after the start; its worker was not stopped", took.Round(time.Millisecond))
			}
		})
	}
}

// TestStrayLauncherDoesNotStopJob: a launcher that fails the rendezvous of
// a running job (a stray one, given other counts, or a late one) calls
// that rendezvous off, which must not read as a failed worker: the job's
// nodes run their workers to the end (they were stopped, "a worker of
// node -1 failed", when the failure watch lay under the rendezvous's
// prefix).
func TestStrayLauncherDoesNotStopJob(t *testing.T) {
	port := freeTCPPort(t, "127.0.0.1")
	runID := "stray" + strconv.Itoa(os.Getpid())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var outs [3]syncBuffer
	dir := t.TempDir()
	script := "sleep 2; touch " + dir + "/done.$RANK"
	ch0 := startNode(ctx, port, runID, node{2, 0, 1, 8 * time.Second}, script, &outs[0])
	ch1 := startNode(ctx, port, runID, node{2, 1, 1, 8 * time.Second}, script, &outs[1])
	time.Sleep(time.Second) // the job's workers run
	stray := result(startNode(ctx, port, runID, node{3, 2, 1, 8 * time.Second}, "true", &outs[2]), "the stray launcher")
	if stray == nil || !strings.Contains(stray.Error(), "every node must be given the same") {
		t.Errorf("the stray launcher: %v; want its counts refused", stray)
	}
	for n, ch := range []chan error{ch0, ch1} {
		if err := result(ch, fmt.Sprintf("node %d", n)); err != nil {
			t.Errorf("node %d: %v\n%s", n, err, outs[n].String())
		}
		if _, err := os.Stat(fmt.Sprintf("%s/done.%d", dir, n)); err != nil {
			t.Errorf("rank %d's worker did not finish: %v", n, err)
		}
	}
}

// TestWrongSecretNamedAtTimeout: a node given another job secret fails
// at once; node 0, which cannot tell whose connection it refused (it
// proved nothing), waits out its rendezvous timeout, and then says, beside
// the node that did not join, that it refused connections meanwhile.
func TestWrongSecretNamedAtTimeout(t *testing.T) {
	runID := "secret-" + strconv.Itoa(os.Getpid())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var outs [2]syncBuffer
	chs := startTwoNodes(ctx, t, runID, "true", &outs, func(n int, c *Config) context.Context {
		c.RdzvTimeout = 3 * time.Second
		if n == 1 {
			c.JobSecret = []byte("another-secret")
		}
		return nil
	})
	err1 := result(chs[1], "node 1")
	err0 := result(chs[0], "node 0")
	t.Logf("node 0: %v\nnode 1: %v", err0, err1)
	if err0 == nil || !strings.Contains(err0.Error(), "did not join") || !strings.Contains(err0.Error(), "connection(s) meanwhile") {
		t.Errorf("node 0: %v; want the missing node and the refused connection named", err0)
	}
}
