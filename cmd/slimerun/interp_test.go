package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/testbin"
)

// TestMissingInterpreterNamed: a program that exists but whose #! line
// names an interpreter that does not is a start failure that says so,
// naming the interpreter, not the kernel's bare "no such file or
// directory" about a file that is there.
func TestMissingInterpreterNamed(t *testing.T) {
	dir := t.TempDir()
	prog := filepath.Join(dir, "job.sh")
	if err := os.WriteFile(prog, []byte("#!/no/such/interp -x\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out, code := testbin.Run(t, 30*time.Second, nil, slimerun, "--standalone", "--nproc-per-node", "2", prog)
	if code == 0 || !strings.Contains(out, "start rank 0") || !strings.Contains(out, `interpreter "/no/such/interp"`) {
		t.Fatalf("exit %d, want a start failure naming the missing interpreter:\n%s", code, out)
	}
	if _, err := exec.LookPath("sh"); err == nil { // a script whose interpreter is there still runs
		if err := os.WriteFile(prog, []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		if out, code := testbin.Run(t, 30*time.Second, nil, slimerun, "--standalone", "--nproc-per-node", "2", prog); code != 0 {
			t.Fatalf("exit %d with /bin/sh:\n%s", code, out)
		}
	}
}
