package launcher

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/testbin"
	"github.com/slimego/slimego/rendezvous"
)

// TestMain lets the test binary serve as a worker that speaks to the
// launcher's store (LAUNCHER_TEST_WORKER names what it does).
func TestMain(m *testing.M) {
	if mode := os.Getenv("LAUNCHER_TEST_WORKER"); mode != "" {
		os.Exit(testWorker(mode))
	}
	os.Exit(m.Run())
}

// testWorker is one worker of a launcher test. "blame": ranks below
// LAUNCHER_TEST_VOTERS record that they blame rank LAUNCHER_TEST_BLAME,
// wait until all of them have, and exit 1; the others wait to be stopped.
func testWorker(mode string) int {
	rank, _ := strconv.Atoi(os.Getenv("RANK"))
	attempt, _ := strconv.Atoi(os.Getenv("SLIME_RESTART_COUNT"))
	run := os.Getenv("SLIME_RUN_ID")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	switch mode {
	case "blame":
		voters, _ := strconv.Atoi(os.Getenv("LAUNCHER_TEST_VOTERS"))
		if rank >= voters {
			<-ctx.Done()
			return 0
		}
		addr := net.JoinHostPort(os.Getenv("MASTER_ADDR"), os.Getenv("SLIME_STORE_PORT"))
		st, err := rendezvous.Dial(ctx, addr, rendezvous.Auth{Secret: []byte(os.Getenv("SLIME_JOB_SECRET")), Job: run})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		defer st.Close()
		if err := st.Set(ctx, BlameKey(run, attempt, rank), []byte(os.Getenv("LAUNCHER_TEST_BLAME"))); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		var keys []string
		for r := range voters {
			keys = append(keys, BlameKey(run, attempt, r))
		}
		if err := st.Wait(ctx, keys...); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
		fmt.Println("blamed", os.Getenv("LAUNCHER_TEST_BLAME"))
		return 1
	}
	fmt.Fprintln(os.Stderr, "unknown LAUNCHER_TEST_WORKER", mode)
	return 2
}

// liveJob starts a standalone job of two workers on a known store port:
// rank 0 exits 0 once dir/go exists, rank 1 once dir/end exists.
func liveJob(t *testing.T) (port int, secret, run, dir string, wait func() error) {
	t.Helper()
	dir = t.TempDir()
	port, secret, run = testbin.FreePort(t), "right-secret", "live"+strconv.Itoa(os.Getpid())
	ch := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	script := `f=` + dir + `/end; [ $RANK = 0 ] && f=` + dir + `/go; while [ ! -e $f ]; do sleep 0.01; done`
	go func() {
		defer cancel()
		var out syncBuffer
		ch <- Run(ctx, Config{Standalone: true, NProcPerNode: 2, MasterPort: port, RunID: run, JobSecret: []byte(secret),
			StopGrace: time.Second, Program: "sh", Args: []string{"-c", script}, Stdout: &out, Stderr: &out})
	}()
	var result error
	ended := false
	wait = func() error {
		if !ended {
			select {
			case result = <-ch:
			case <-time.After(30 * time.Second):
				result = errors.New("the job did not end within 30 s")
			}
			ended = true
		}
		return result
	}
	t.Cleanup(func() {
		os.WriteFile(filepath.Join(dir, "go"), nil, 0o600)
		os.WriteFile(filepath.Join(dir, "end"), nil, 0o600)
		wait()
	})
	return port, secret, run, dir, wait
}

func dialStore(t *testing.T, port int, secret, run string) (*rendezvous.Client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return rendezvous.Dial(ctx, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), rendezvous.Auth{Secret: []byte(secret), Job: run})
}

// When a worker exits (here with code 0) while another still runs, a
// client waiting on a key of the attempt fails within 2 s with an
// *AbortError naming the rank, instead of waiting out its timeout; a
// client with the wrong secret is refused, and the job still passes.
func TestWorkerExitAbortsWaiters(t *testing.T) {
	port, secret, run, dir, wait := liveJob(t)
	st, err := dialStore(t, port, secret, run)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := dialStore(t, port, "wrong-secret", run); !errors.Is(err, rendezvous.ErrDenied) {
		t.Fatalf("a client with the wrong secret: %v, want ErrDenied", err)
	}
	got := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := st.Get(ctx, rendezvous.AttemptPrefix(run, 0)+"never")
		got <- err
	}()
	exitAt := time.Now()
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		var ae *rendezvous.AbortError
		if !errors.As(err, &ae) || ae.Rank != 0 || !strings.Contains(ae.Reason, "rank 0 (pid ") || !strings.Contains(ae.Reason, "exited with code 0") {
			t.Fatalf("the waiter got %v; want an *AbortError naming rank 0's exit", err)
		}
		if d := time.Since(exitAt); d > 2*time.Second {
			t.Errorf("the abort took %v after rank 0 was told to exit", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter still waits 10 s after rank 0 exited")
	}
	os.WriteFile(filepath.Join(dir, "end"), nil, 0o600)
	if err := wait(); err != nil {
		t.Fatalf("the job failed: %v", err)
	}
}

// A job on one node binds its store to loopback only: it is not reachable
// on any other address of this host.
func TestStandaloneStoreOnLoopbackOnly(t *testing.T) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var others []net.IP
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && !ipn.IP.IsLinkLocalUnicast() {
			others = append(others, ipn.IP)
		}
	}
	if len(others) == 0 {
		t.Skip("this host has no address but loopback")
	}
	port, secret, run, _, _ := liveJob(t)
	st, err := dialStore(t, port, secret, run)
	if err != nil {
		t.Fatalf("the store is not up on loopback: %v", err)
	}
	st.Close()
	for _, ip := range others {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(ip.String(), strconv.Itoa(port)), 2*time.Second)
		if err == nil {
			c.Close()
			t.Errorf("the standalone store answers on %s:%d", ip, port)
		}
	}
}

// After a stalled rank makes its peers fail, the job's error names the
// rank the failed workers blame, not only the first failure.
func TestBlamedRankNamed(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var out syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = Run(ctx, Config{Standalone: true, NProcPerNode: 3, MonitorInterval: time.Second, StopGrace: time.Second,
		Env:     append(os.Environ(), "LAUNCHER_TEST_WORKER=blame", "LAUNCHER_TEST_VOTERS=2", "LAUNCHER_TEST_BLAME=2"),
		Program: exe, Stdout: &out, Stderr: &out})
	var je *JobError
	var we *WorkerError
	if !errors.As(err, &je) || !errors.As(err, &we) {
		t.Fatalf("err = %v, want a *JobError\n%s", err, out.String())
	}
	if je.Blamed != 2 || !strings.HasPrefix(je.Summary, "rank 2 did not exit; rank") || !strings.Contains(je.Summary, "exited with code 1") {
		t.Fatalf("blamed %d (%q), want rank 2, which did not exit\n%s", je.Blamed, je.Summary, out.String())
	}
	if !strings.Contains(err.Error(), "rank 2 is the one the others' errors name (rank 2 did not exit;") {
		t.Errorf("err = %v", err)
	}
	if we.Rank == 2 {
		t.Errorf("first failure %v: rank 2 did not fail", we)
	}
}

func TestChooseBlamed(t *testing.T) {
	for _, tc := range []struct {
		name   string
		failed []int
		blames map[int]int
		want   int
	}{
		{"none", []int{0, 1}, nil, -1},
		{"all blame a survivor", []int{0, 1, 2}, map[int]int{0: 3, 1: 3, 2: 3}, 3},
		{"majority", []int{0, 1, 2}, map[int]int{0: 3, 1: 3, 2: 0}, 3},
		{"no majority", []int{0, 1, 2, 4}, map[int]int{0: 3, 1: 2}, -1},
		{"tie", []int{0, 1}, map[int]int{0: 1, 1: 0}, -1},
		{"the accused does not count", []int{0, 3}, map[int]int{0: 3, 3: 0}, -1},
		{"the accused failed too", []int{0, 1, 3}, map[int]int{0: 3, 1: 3}, 3},
		{"self-blame ignored", []int{0, 1}, map[int]int{0: 0, 1: 0}, 0},
		{"a remote voter", []int{0}, map[int]int{0: 5, 2: 5}, 5},
		{"exactly half is no majority", []int{0, 1, 2, 3, 4}, map[int]int{0: 4, 1: 4}, -1},
	} {
		got, ok := chooseBlamed(tc.failed, tc.blames)
		if ok != (tc.want >= 0) || got != tc.want {
			t.Errorf("%s: chooseBlamed(%v, %v) = %d, %v; want %d", tc.name, tc.failed, tc.blames, got, ok, tc.want)
		}
	}
}

// On a node other than 0, a worker's exit reaches node 0's store through
// the launcher's connection to it: a waiter fails within 2 s with an
// *AbortError naming that worker's rank.
func TestRemoteWorkerExitAborts(t *testing.T) {
	dir := t.TempDir()
	port, secret := testbin.FreePort(t), "remote-secret"
	run := "remote" + strconv.Itoa(os.Getpid())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Rank 1 (node 1) exits 0 once dir/go exists, rank 0 once dir/end does.
	script := `f=` + dir + `/end; [ $RANK = 1 ] && f=` + dir + `/go; while [ ! -e $f ]; do sleep 0.01; done`
	errs := make(chan error, 2)
	var outs [2]syncBuffer
	for node := range 2 {
		go func() {
			errs <- Run(ctx, Config{NNodes: 2, NodeRank: node, NProcPerNode: 1, MasterAddr: "127.0.0.1", MasterPort: port,
				RunID: run, JobSecret: []byte(secret), RdzvTimeout: 30 * time.Second, StopGrace: time.Second,
				Program: "sh", Args: []string{"-c", script}, Stdout: &outs[node], Stderr: &outs[node]})
		}()
	}
	defer func() {
		os.WriteFile(filepath.Join(dir, "go"), nil, 0o600)
		os.WriteFile(filepath.Join(dir, "end"), nil, 0o600)
		for node := range 2 {
			select {
			case err := <-errs:
				if err != nil {
					t.Errorf("a node failed: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("node %d did not end", node)
			}
		}
	}()
	st, err := dialStore(t, port, secret, run)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// Both launchers have joined once the node barrier is complete.
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	if err := st.Wait(wctx, "slimerun/"+run+"/nodes/0", "slimerun/"+run+"/nodes/1"); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := st.Get(wctx, rendezvous.AttemptPrefix(run, 0)+"never")
		got <- err
	}()
	exitAt := time.Now()
	os.WriteFile(filepath.Join(dir, "go"), nil, 0o600)
	select {
	case err := <-got:
		var ae *rendezvous.AbortError
		if !errors.As(err, &ae) || ae.Rank != 1 || !strings.Contains(ae.Reason, "rank 1 (pid ") {
			t.Fatalf("the waiter got %v; want an *AbortError naming rank 1", err)
		}
		if d := time.Since(exitAt); d > 2*time.Second {
			t.Errorf("the abort took %v after rank 1 was told to exit", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter still waits 10 s after rank 1 exited")
	}
}

// TestRefusedConnectionWarned: the store refuses a client given another
// secret, and the launcher warns its user at once (a node started without
// the job's secret would otherwise leave the job waiting for nothing),
// naming the client's address and the secret; four more refused within
// the second make one more warning, at its end, counting them.
func TestRefusedConnectionWarned(t *testing.T) {
	dir := t.TempDir()
	port, run := testbin.FreePort(t), "refused"+strconv.Itoa(os.Getpid())
	var warns logLines
	ch := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	go func() {
		var out syncBuffer
		ch <- Run(ctx, Config{Standalone: true, NProcPerNode: 1, MasterPort: port, RunID: run, JobSecret: []byte("right-secret"),
			Program: "sh", Args: []string{"-c", `while [ ! -e ` + dir + `/end ]; do sleep 0.01; done`}, Stdout: &out, Stderr: &out, Warnf: warns.logf})
	}()
	defer func() {
		os.WriteFile(filepath.Join(dir, "end"), nil, 0o600)
		if err := <-ch; err != nil {
			t.Errorf("the job: %v", err)
		}
	}()
	st, err := dialStore(t, port, "right-secret", run)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	for range 5 {
		if _, err := dialStore(t, port, "wrong-secret", run); !errors.Is(err, rendezvous.ErrDenied) {
			t.Fatalf("a client with the wrong secret: %v, want ErrDenied", err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		var got []string
		warns.mu.Lock()
		for _, l := range warns.lines {
			if strings.Contains(l, "refused") {
				got = append(got, l)
			}
		}
		warns.mu.Unlock()
		if len(got) > 0 {
			if !strings.Contains(got[0], "refused a connection from 127.0.0.1:") || !strings.Contains(got[0], "SLIME_JOB_SECRET") {
				t.Fatalf("warnings %q; want the first naming the client and the secret", got)
			}
			if len(got) == 2 {
				if !strings.Contains(got[1], "refused 4 more connections, the last from 127.0.0.1:") {
					t.Fatalf("warnings %q; want the second counting the four others", got)
				}
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("warnings %q 5 s after five clients with the wrong secret were refused; want two", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestAbortsInOrder: a node's aborts reach the store in the order they
// were made, even when the first is the slower to send (the store keeps
// the first it gets): the rank that caused the failure is named, not the
// ranks stopped because of it.
func TestAbortsInOrder(t *testing.T) {
	run := "order" + strconv.Itoa(os.Getpid())
	a := rendezvous.Auth{Secret: []byte("order-secret"), Job: run}
	srv, err := rendezvous.Listen("127.0.0.1:0", rendezvous.ServerConfig{Auth: a})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl, err := rendezvous.Dial(ctx, srv.Addr().String(), a)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	testHookAbort = func(rank int) {
		if rank == 3 {
			time.Sleep(300 * time.Millisecond)
		}
	}
	defer func() { testHookAbort = nil }()
	j := &job{cfg: &Config{RunID: run, NodeRank: 1, Logf: t.Logf}, client: cl}
	j.abort(0, 3, "rank 3 did not start", true)
	j.abort(0, 2, "rank 2 was killed by signal 15", false)
	j.aborts.Wait()
	_, err = cl.Get(ctx, rendezvous.AttemptPrefix(run, 0)+"never")
	var ae *rendezvous.AbortError
	if !errors.As(err, &ae) || ae.Rank != 3 || ae.Reason != "rank 3 did not start" {
		t.Fatalf("a waiter got %v; want the first abort, rank 3's", err)
	}
}

// TestFreePortOutsideEphemeral: the workers' MASTER_PORT is free on every
// address (torch's store binds the wildcard) and lies outside the
// kernel's ephemeral range, where any process's outgoing connection could
// take it before torch binds it.
func TestFreePortOutsideEphemeral(t *testing.T) {
	lo, _, ok := ephemeralRange()
	if !ok {
		t.Skip("no /proc/sys/net/ipv4/ip_local_port_range")
	}
	for range 20 {
		p, err := freePort("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		if p >= lo {
			t.Fatalf("port %d is in the ephemeral range (from %d)", p, lo)
		}
		l, err := net.Listen("tcp", ":"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("port %d is not free on every address: %v", p, err)
		}
		l.Close()
	}
}
