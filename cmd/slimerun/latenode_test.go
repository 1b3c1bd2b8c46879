package main

import (
	"context"

	"github.com/slimego/slimego/rendezvous"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// delayProxy forwards every connection it accepts to upstream, each chunk
// delay later in either direction: a network link with a round trip of
// 2×delay. A connection it cannot forward is closed, as a refused one.
func delayProxy(t *testing.T, upstream string, delay time.Duration) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	pipe := func(dst, src net.Conn) {
		defer dst.Close()
		buf := make([]byte, 64<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				time.Sleep(delay)
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				if err != io.EOF {
					return
				}
				return
			}
		}
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				u, err := net.Dial("tcp", upstream)
				if err != nil {
					c.Close()
					return
				}
				go pipe(u, c)
				pipe(c, u)
			}()
		}
	}()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// storeUp waits (up to 10 s) until node 0's store listens on port of
// loopback; out is node 0's output, for the failure.
func storeUp(t *testing.T, port string, out *os.File) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if c, err := net.Dial("tcp", "127.0.0.1:"+port); err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node 0's store did not come up:\n%s", text(out))
		}
	}
}

// TestMissingProgramOnNode0ReachesRemoteNode: node 0 lacks the program;
// node 1 reaches it over a link with a 30 ms round trip (any network
// between two machines, or a loaded host). Node 1 must fail within seconds
// naming node 0 and the program, as it does on loopback
// (TestMissingProgramCallsOffRendezvous), not at its rendezvous timeout.
func TestMissingProgramOnNode0ReachesRemoteNode(t *testing.T) {
	port := freePortString(t)
	missing := filepath.Join(t.TempDir(), "no-such-program")
	common := []string{"--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--rdzv-id", "p" + port, "--rdzv-timeout", "60s"}
	_, out0, done0 := startSlimerun(t, "no-program", append(append([]string{"--node-rank", "0", "--master-port", port}, common...), missing)...)
	// Node 0's store is up before node 1 starts (node 1 would wait for it anyway).
	storeUp(t, port, out0)
	proxied := delayProxy(t, "127.0.0.1:"+port, 15*time.Millisecond)
	t0 := time.Now()
	_, out1, done1 := startSlimerun(t, "no-program", append(append([]string{"--node-rank", "1", "--master-port", proxied}, common...), "true")...)
	for n, c := range []struct {
		done chan error
		want int
	}{{done0, 2}, {done1, 1}} {
		code, ok := exited(c.done, 25*time.Second)
		if !ok {
			t.Fatalf("node %d still runs %v after node 1's start:\nnode 0:\n%s\nnode 1:\n%s", n, time.Since(t0).Round(time.Millisecond), text(out0), text(out1))
		}
		if code != c.want {
			t.Errorf("node %d: exit %d, want %d", n, code, c.want)
		}
	}
	if s := text(out1); !strings.Contains(s, "node 0") || !strings.Contains(s, missing) {
		t.Errorf("node 1 does not name node 0 and the program:\n%s", s)
	}
	t.Logf("node 1 ended after %v\nnode 0:\n%snode 1:\n%s", time.Since(t0).Round(time.Millisecond), text(out0), text(out1))
}

// TestMissingProgramWithoutNode0: node 1 lacks the program and node 0's
// store never comes. It is still bad usage (exit 2) naming the program,
// as before 703a501, not "store unreachable" (exit 1) after the rendezvous
// timeout with no word of the program.
func TestMissingProgramWithoutNode0(t *testing.T) {
	port := freePortString(t)
	missing := filepath.Join(t.TempDir(), "no-such-program")
	_, out, done := startSlimerun(t, "no-program", "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "1",
		"--master-addr", "127.0.0.1", "--master-port", port, "--rdzv-timeout", "3s", missing)
	code, ok := exited(done, 20*time.Second)
	if !ok {
		t.Fatalf("still runs:\n%s", text(out))
	}
	if s := text(out); code != 2 || !strings.Contains(s, missing) {
		t.Errorf("exit %d, want 2 naming %s:\n%s", code, missing, s)
	}
	t.Logf("\n%s", text(out))
}

// waitPeerWorker is a worker that waits, in the launcher's store, for a
// key of its attempt that no rank sets (as a worker's Init waits for its
// peers), and fails (exit 1) when the attempt is aborted.
func waitPeerWorker() int {
	run, restart := os.Getenv("SLIME_RUN_ID"), os.Getenv("SLIME_RESTART_COUNT")
	os.WriteFile(filepath.Join(os.Getenv("SLIMERUN_TEST_DIR"), "up."+os.Getenv("RANK")+"."+restart), nil, 0o600)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := rendezvous.Dial(ctx, net.JoinHostPort(os.Getenv("MASTER_ADDR"), os.Getenv("SLIME_STORE_PORT")),
		rendezvous.Auth{Secret: []byte(os.Getenv("SLIME_JOB_SECRET")), Job: run})
	if err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 1
	}
	n, _ := strconv.Atoi(restart)
	err = st.Wait(ctx, rendezvous.AttemptPrefix(run, n)+"peer")
	os.Stderr.WriteString("worker: " + err.Error() + "\n")
	return 1
}

// TestStartFailureStopsOtherNodesWhoseWorkersWait: as
// TestStartFailureStopsOtherNodes, but node 0's worker waits for its peers
// in the store (as every real worker's Init does), and node 1 reaches node
// 0 over a slow link. Node 1's start failure aborts the attempt, which
// fails node 0's worker before node 1's second abort (the failure report)
// arrives: node 0 must still not restart into a rendezvous node 1 never
// joins.
func TestStartFailureStopsOtherNodesWhoseWorkersWait(t *testing.T) {
	port := freePortString(t)
	dir := t.TempDir()
	prog := filepath.Join(dir, "prog")
	if err := os.WriteFile(prog, []byte("#!"+filepath.Join(dir, "no-such-interpreter")+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	common := []string{"--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--rdzv-id", "p" + port,
		"--rdzv-timeout", "60s", "--stop-grace", "1s", "--max-restarts", "3"}
	_, out0, done0 := startSlimerun(t, "start-fails", append(append([]string{"--node-rank", "0", "--master-port", port}, common...),
		"env", "SLIMERUN_TEST_WORKER=waitpeer", "SLIMERUN_TEST_DIR="+dir, self)...)
	storeUp(t, port, out0)
	proxied := delayProxy(t, "127.0.0.1:"+port, 100*time.Millisecond)
	_, out1, done1 := startSlimerun(t, "start-fails", append(append([]string{"--node-rank", "1", "--master-port", proxied}, common...), prog)...)
	t0 := time.Now()
	for n, done := range []chan error{done0, done1} {
		if _, ok := exited(done, 30*time.Second); !ok {
			t.Fatalf("node %d still runs %v:\nnode 0:\n%s\nnode 1:\n%s", n, time.Since(t0).Round(time.Millisecond), text(out0), text(out1))
		}
	}
	if m, _ := filepath.Glob(dir + "/up.*.[1-9]"); len(m) > 0 || strings.Contains(text(out0), "restarting") {
		t.Errorf("node 0 restarted its workers after node 1's start failed (%v):\n%s", m, text(out0))
	}
	if s := text(out0); !strings.Contains(s, "start rank 1") {
		t.Errorf("node 0 does not name rank 1's start:\n%s", s)
	}
	t.Logf("node 0:\n%snode 1:\n%s", text(out0), text(out1))
}
