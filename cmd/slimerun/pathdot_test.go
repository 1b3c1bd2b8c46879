package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestProgramFoundThroughDotInPath: where the user's PATH holds "." (or an
// empty entry), a program in the current directory named without a slash
// runs, as the shell and torchrun (subprocess, execvp) run it; Go's
// exec.LookPath refuses it (exec.ErrDot) unless told otherwise.
func TestProgramFoundThroughDotInPath(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "myprog"), []byte("#!/bin/sh\necho \"myprog $RANK\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{".:" + os.Getenv("PATH"), os.Getenv("PATH") + ":"} {
		cmd := exec.Command(slimerun, "-q", "--standalone", "--nproc-per-node", "2", "myprog")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "PATH="+path)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "[0]: myprog 0") || !strings.Contains(string(out), "[1]: myprog 1") {
			t.Errorf("PATH=%s: %v; want both workers' output:\n%s", path, err, out)
		}
	}
}
