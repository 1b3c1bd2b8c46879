package collective_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slimego/slimego/rendezvous"
)

// startSlimerun starts one slimerun with args and returns it with its
// combined output, which fills while it runs.
func startSlimerun(t *testing.T, env []string, args ...string) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir(t), "slimerun"), args...)
	cmd.Env = append(cleanEnv(), env...)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, out
}

// waitExit waits for cmd, at most limit, and returns its exit code.
func waitExit(t *testing.T, cmd *exec.Cmd, limit time.Duration, out *syncBuffer) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(limit):
		cmd.Process.Kill()
		<-done
		t.Fatalf("%v hung; output:\n%s", cmd.Args, out.String())
		return -1
	}
}

// syncBuffer collects a process's output while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// foreignSecrets are what a process outside the job may try: no secret, a
// guessed one.
var foreignSecrets = [][]byte{nil, []byte("guess")}

// TestForeignClientCannotPlantSegment plays a neighbour on the host who
// connects to a live job's store and replaces the name of the node's
// shared-memory segment with a path to a file of its choice, which a rank
// would otherwise open, map read-write and delete. The store refuses it,
// the file survives, and the job passes.
func TestForeignClientCannotPlantSegment(t *testing.T) {
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	runID := fmt.Sprintf("sec%d-%d", os.Getpid(), time.Now().UnixNano()%1e9)
	// Rank 1 joins a second late: the attack has time to land first.
	cmd, out := startSlimerun(t, nil, "--nproc-per-node", "2", "--master-port", strconv.Itoa(port), "--rdzv-id", runID,
		filepath.Join(binDir(t), "agcheck"), "--sizes", "0,4096", "--iters", "1", "--plan-runs", "10", "--fault-rank", "1", "--init-delay", "1s")
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	key := rendezvous.AttemptPrefix(runID, 0) + "world/node0/seg"
	planted := "../.." + victim
	for _, secret := range foreignSecrets {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		st, err := rendezvous.Dial(ctx, addr, rendezvous.Auth{Secret: secret, Job: runID})
		if err == nil {
			if _, err := st.Get(ctx, key); err == nil {
				st.Set(ctx, key, []byte(planted))
			}
			st.Close()
			cancel()
			t.Errorf("a client with secret %q joined the job's store", secret)
			continue
		}
		cancel()
		if !errors.Is(err, rendezvous.ErrDenied) {
			t.Errorf("secret %q: err %v, want ErrDenied", secret, err)
		}
	}
	if code := waitExit(t, cmd, 2*time.Minute, out); code != 0 || strings.Count(out.String(), "PASS rank") != 2 {
		t.Errorf("job exit %d:\n%s", code, out.String())
	}
	if b, err := os.ReadFile(victim); err != nil || string(b) != "precious" {
		t.Errorf("the planted file: %q, %v", b, err)
	}
}

// TestForeignClientCannotRedirect plays a client that rewrites, in a
// two-node job's store, the address rank 1 published for its connections
// with that of its own relay, to see the job's data. The store refuses it
// and nothing goes through the relay.
func TestForeignClientCannotRedirect(t *testing.T) {
	relay, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	var relayed atomic.Int64
	go func() {
		for {
			c, err := relay.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				n, _ := io.Copy(io.Discard, c)
				relayed.Add(n + 1)
			}()
		}
	}()
	port := freePort(t)
	runID := fmt.Sprintf("sec%d-%d", os.Getpid(), time.Now().UnixNano()%1e9)
	env := []string{"SLIME_JOB_SECRET=" + "s3cret-" + runID}
	var cmds []*exec.Cmd
	var outs []*syncBuffer
	for n := range 2 {
		cmd, out := startSlimerun(t, env, "--nnodes", "2", "--node-rank", strconv.Itoa(n), "--master-addr", "127.0.0.1",
			"--master-port", strconv.Itoa(port), "--rdzv-id", runID, "--nproc-per-node", "1",
			filepath.Join(binDir(t), "agcheck"), "--sizes", "4096,1048579", "--iters", "1", "--plan-runs", "10", "--fault-rank", "0", "--init-delay", "1s")
		cmds, outs = append(cmds, cmd), append(outs, out)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	key := rendezvous.AttemptPrefix(runID, 0) + "world/net/addr/1"
	for _, secret := range foreignSecrets {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		st, err := rendezvous.Dial(ctx, addr, rendezvous.Auth{Secret: secret, Job: runID})
		if err == nil {
			if _, err := st.Get(ctx, key); err == nil {
				st.Set(ctx, key, []byte(relay.Addr().String()))
			}
			st.Close()
			cancel()
			t.Errorf("a client with secret %q joined the job's store", secret)
			continue
		}
		cancel()
		if !errors.Is(err, rendezvous.ErrDenied) {
			t.Errorf("secret %q: err %v, want ErrDenied", secret, err)
		}
	}
	for n, cmd := range cmds {
		if code := waitExit(t, cmd, 2*time.Minute, outs[n]); code != 0 || !strings.Contains(outs[n].String(), "PASS rank") {
			t.Errorf("node %d exit %d:\n%s", n, code, outs[n].String())
		}
	}
	if n := relayed.Load(); n != 0 {
		t.Errorf("%d bytes (plus connections) went through the foreign relay", n)
	}
}

// TestRankExitsBeforeInit: a rank that exits cleanly before it ever calls
// Init makes every other rank's Init fail within seconds, with ErrPeerLost
// naming it, though the timeout is a minute: slimerun saw the exit and
// told the store.
func TestRankExitsBeforeInit(t *testing.T) {
	j := expectFault(t, []string{"SLIME_TIMEOUT=60"}, 3, []int{0, 2}, "--fault", "exit-before-init", "--fault-rank", "1")
	for _, r := range []int{0, 2} {
		if !regexp.MustCompile(fmt.Sprintf(`EXPECTED rank %d: init rank %d peer 1: slimego: peer lost: .*rank 1 .*exited with code 0`, r, r)).MatchString(j.out) {
			t.Errorf("rank %d did not name rank 1 and its exit:\n%s", r, j.out)
		}
	}
	if j.wall > 15*time.Second {
		t.Errorf("the others took %v to notice; slimerun knew at once", j.wall)
	}
}

// TestStoreHostDeathNamed: with no launcher, rank 0 hosts the store; when
// it dies during Init, the others report ErrPeerLost naming rank 0, at
// once, not a timeout naming whichever rank they were waiting for.
func TestStoreHostDeathNamed(t *testing.T) {
	port := strconv.Itoa(freePort(t))
	runID := fmt.Sprintf("sh%d-%d", os.Getpid(), time.Now().UnixNano()%1e9)
	// A world of 3 whose rank 2 never comes: ranks 0 and 1 wait in Init.
	start := func(r int) (*exec.Cmd, *syncBuffer) {
		cmd := exec.Command(filepath.Join(binDir(t), "agcheck"))
		cmd.Env = append(cleanEnv(), "RANK="+strconv.Itoa(r), "WORLD_SIZE=3", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1",
			"GROUP_RANK="+strconv.Itoa(r), "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+port, "SLIME_RUN_ID="+runID, "SLIME_TIMEOUT=60")
		out := &syncBuffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, out
	}
	host, hostOut := start(0)
	waitListening(t, "127.0.0.1:"+port)
	other, out := start(1)
	// Rank 1 has published its layout: it is in the store, waiting for
	// rank 2's.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := rendezvous.Dial(ctx, "127.0.0.1:"+port, rendezvous.Auth{Job: runID})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Get(ctx, rendezvous.AttemptPrefix(runID, 0)+"world/layout/1"); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	host.Process.Kill()
	waitExit(t, host, 10*time.Second, hostOut)
	code := waitExit(t, other, 30*time.Second, out)
	if took := time.Since(killed); took > 5*time.Second {
		t.Errorf("rank 1 took %v to notice", took)
	}
	if code == 0 || !strings.Contains(out.String(), "init rank 1 peer 0: slimego: peer lost") || !strings.Contains(out.String(), "rank 0, which hosts the store") {
		t.Errorf("exit %d, want ErrPeerLost naming rank 0 as the store's host:\n%s", code, out.String())
	}
}

func waitListening(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("nothing listens on %s", addr)
}

// TestOwnRunIDUnderSlimerun: a program that names its keys itself
// (Options.RunID) still joins its launcher's store, and a restarted
// attempt is not failed by the abort of the attempt before it.
func TestOwnRunIDUnderSlimerun(t *testing.T) {
	j := slimerun(t, []string{"SLIME_TIMEOUT=60"}, "--nproc-per-node", "2", "--max-restarts", "1", "agcheck", "--run-id", "mine",
		"--sizes", "0,4096", "--iters", "1", "--plan-runs", "10", "--fault-rank", "1", "--fail-first-attempt")
	if j.code != 0 || strings.Count(j.out, "PASS rank") != 2 {
		t.Fatalf("exit %d, %d ranks passed:\n%s\n%s", j.code, strings.Count(j.out, "PASS rank"), j.out, j.stderr)
	}
}
