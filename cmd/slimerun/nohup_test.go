package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestNohupSurvivesHangup: slimerun started under nohup (SIGHUP ignored,
// as `nohup slimerun ... &` before logging out of an ssh session) keeps
// the job running when the hangup comes: it leaves SIGHUP ignored, for
// itself and its workers, as nohup means, rather than taking it as a
// request to stop them.
func TestNohupSurvivesHangup(t *testing.T) {
	nohup, err := exec.LookPath("nohup")
	if err != nil {
		t.Skip("no nohup:", err)
	}
	dir := t.TempDir()
	cmd := exec.Command(nohup, slimerun, "--standalone", "--nproc-per-node", "2",
		"sh", "-c", `touch `+dir+`/up.$RANK; sleep 1.5; echo "survived $RANK"`)
	cmd.Dir = dir // where nohup would put nohup.out
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		_, e0 := os.Stat(filepath.Join(dir, "up.0"))
		_, e1 := os.Stat(filepath.Join(dir, "up.1"))
		if e0 == nil && e1 == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("workers did not start:\n%s", out.String())
		}
	}
	cmd.Process.Signal(syscall.SIGHUP) // nohup has exec'd slimerun: its pid
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil || !strings.Contains(out.String(), "[0]: survived 0") || !strings.Contains(out.String(), "[1]: survived 1") {
			t.Errorf("slimerun under nohup, after SIGHUP: %v; want exit 0 with both workers' output\n%s", err, out.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("slimerun did not end:\n%s", out.String())
	}
}
