package main

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// build compiles slimerun and this example into a temporary directory.
func build(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	_, file, _, _ := runtime.Caller(0)
	cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/slimerun", "./examples/kvcache")
	cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return dir
}

// slimerun runs kvcache under slimerun on this host, bounded in time.
func slimerun(t *testing.T, dir string, nproc string, args ...string) (string, int) {
	t.Helper()
	full := append([]string{"--standalone", "--nproc-per-node", nproc, filepath.Join(dir, "kvcache"), "--timeout", "20s"}, args...)
	cmd := exec.Command(filepath.Join(dir, "slimerun"), full...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if ee, ok := err.(*exec.ExitError); ok {
			return out.String(), ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), 0
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill()
		<-done
		t.Fatalf("slimerun kvcache %v hung:\n%s", args, out.String())
	}
	return "", -1
}

// TestKVCache runs the example under slimerun, as real processes: 2
// prefill and 2 decode ranks over the same-host transport, 3 prefill and 1
// decode over TCP with pages that do not divide evenly, and every decode
// rank reports every page checked with no wrong byte. A page sent with
// one wrong byte must make the job exit non-zero, naming the wrong data.
func TestKVCache(t *testing.T) {
	dir := build(t)
	for _, tc := range []struct {
		name, nproc string
		args        []string
		prefill     int
		transport   string
	}{
		{"2+2 same host", "4", []string{"--pages", "512", "--page-size", "8K", "--batch", "64"}, 2, "[cma]"},
		{"3+1 tcp", "4", []string{"--prefill", "3", "--tcp-only", "--pages", "301", "--page-size", "3000", "--batch", "16", "--inflight", "2"}, 3, "[tcp]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, code := slimerun(t, dir, tc.nproc, tc.args...)
			if code != 0 || strings.Count(out, "PASS rank") != 4 || strings.Count(out, "(prefill)") != tc.prefill ||
				strings.Count(out, "over "+tc.transport) != tc.prefill || strings.Contains(out, " 0 pages") {
				t.Fatalf("exit %d:\n%s", code, out)
			}
		})
	}
	t.Run("a wrong byte", func(t *testing.T) {
		out, code := slimerun(t, dir, "2", "--pages", "64", "--batch", "8", "--corrupt-page", "5")
		if code == 0 || !strings.Contains(out, "wrong data: round 0: 1 wrong bytes") {
			t.Fatalf("exit %d, want a failure naming the wrong byte:\n%s", code, out)
		}
	})
}
