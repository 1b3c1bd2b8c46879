package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSignalDuringRendezvous: SIGTERM or SIGINT to a node's slimerun
// while it waits in the rendezvous for a node that has not come ends it at
// once, exit 128+signal saying so, and calls the rendezvous off for the
// others: node 0 fails within seconds naming node 1 and the signal, not
// after its rendezvous timeout (a minute here).
func TestSignalDuringRendezvous(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
			l.Close()
			start := func(rank string) (*exec.Cmd, *os.File, chan error) {
				cmd := exec.Command(slimerun, "--nnodes", "3", "--node-rank", rank, "--nproc-per-node", "1",
					"--master-addr", "127.0.0.1", "--master-port", port, "--rdzv-timeout", "60s", "--stop-grace", "1s", "true")
				cmd.Env = append(os.Environ(), "SLIME_JOB_SECRET=rdzv-signal")
				out, err := os.Create(filepath.Join(t.TempDir(), "out"))
				if err != nil {
					t.Fatal(err)
				}
				cmd.Stdout, cmd.Stderr = out, out
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				done := make(chan error, 1)
				go func() { done <- cmd.Wait() }()
				t.Cleanup(func() { cmd.Process.Kill(); done <- <-done; out.Close() })
				return cmd, out, done
			}
			_, out0, done0 := start("0")
			n1, out1, done1 := start("1")
			// Node 1 is in the rendezvous once it has said which run it
			// joins (its signals are handled from before then); give it
			// the time to reach the node barrier.
			for deadline := time.Now().Add(15 * time.Second); !strings.Contains(text(out1), "run p"+port); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("node 1 did not start:\n%s", text(out1))
				}
			}
			time.Sleep(500 * time.Millisecond)
			t0 := time.Now()
			n1.Process.Signal(sig)
			wait := func(done chan error, what string, out *os.File) int {
				select {
				case err := <-done:
					done <- err // for the cleanup
					if ee, ok := err.(*exec.ExitError); ok {
						return ee.ExitCode()
					}
					if err != nil {
						t.Fatalf("%s: %v", what, err)
					}
					return 0
				case <-time.After(15 * time.Second):
					t.Fatalf("%s still runs %v after node 1's %v\n%s", what, time.Since(t0).Round(time.Millisecond), sig, text(out))
				}
				return 0
			}
			if code := wait(done1, "node 1", out1); code != 128+int(sig) || !strings.Contains(text(out1), "interrupted by") {
				t.Errorf("node 1: exit %d, want %d saying it was interrupted:\n%s", code, 128+int(sig), text(out1))
			}
			if code := wait(done0, "node 0", out0); code != 1 || !strings.Contains(text(out0), "node 1 was interrupted by "+sig.String()) {
				t.Errorf("node 0: exit %d, want 1 naming node 1's %v:\n%s", code, sig, text(out0))
			}
			t.Logf("node 1:\n%snode 0:\n%s", text(out1), text(out0))
		})
	}
}

// text is what a process has written to f so far.
func text(f *os.File) string {
	b, _ := os.ReadFile(f.Name())
	return string(b)
}
