package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunPath: torchrun's --run-path (--run_path, PET_RUN_PATH) runs the
// script as Python whatever its name, before --no-python, as torchrun's
// runpy.run_path does: a command line written for torchrun runs.
func TestRunPath(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3:", err)
	}
	dir := t.TempDir()
	script := filepath.Join(dir, "train") // no .py, not executable
	if err := os.WriteFile(script, []byte("import os, sys\nprint('rank', os.environ['RANK'], sys.argv[1:])\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		env  []string
	}{
		{"run-path", []string{"--run-path", script, "--lr", "1"}, nil},
		{"run_path before no-python", []string{"--no-python", "--run_path", script, "--lr", "1"}, nil},
		{"PET_RUN_PATH", []string{script, "--lr", "1"}, []string{"PET_RUN_PATH=1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(slimerun, append([]string{"-q", "--standalone", "--nproc-per-node", "2"}, tc.args...)...)
			cmd.Env = append(os.Environ(), tc.env...)
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.Contains(string(out), "[0]: rank 0 ['--lr', '1']") || !strings.Contains(string(out), "[1]: rank 1 ['--lr', '1']") {
				t.Errorf("%v; want both ranks' output of the script run by python3:\n%s", err, out)
			}
		})
	}
}
