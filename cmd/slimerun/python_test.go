package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A Python program runs as torchrun runs it: a script ending in .py (not
// executable, no #! line) under python3 -u, -m/--module a module, and
// --no-python runs the program as it is, PYTHON_EXEC names the
// interpreter; ROLE_NAME is --role's
// (torchrun's default "default"), and --start-method is accepted.
func TestPythonPrograms(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3:", err)
	}
	dir := t.TempDir()
	const body = "import os, sys\nprint('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], os.environ['ROLE_NAME'], sys.argv[1:], 'unbuffered' if sys.stdout.write_through else 'buffered')\n"
	if err := os.WriteFile(filepath.Join(dir, "prog.py"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "pkg"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "pkg", "__init__.py"), nil, 0o644)
	os.WriteFile(filepath.Join(dir, "pkg", "mod.py"), []byte(body), 0o644)
	os.WriteFile(filepath.Join(dir, "wrapped-python"), []byte("#!/bin/sh\necho wrapped\nexec python3 \"$@\"\n"), 0o755)
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"script", []string{"prog.py", "--x", "1"}, []string{"[0]: rank 0 of 2 default ['--x', '1'] unbuffered", "[1]: rank 1 of 2 default ['--x', '1'] unbuffered"}},
		{"module", []string{"--role", "trainer", "--start-method", "spawn", "-m", "pkg.mod", "y"}, []string{"[0]: rank 0 of 2 trainer ['y'] unbuffered", "[1]: rank 1 of 2 trainer ['y'] unbuffered"}},
		{"no python", []string{"--no-python", "python3", "prog.py"}, []string{"[0]: rank 0 of 2 default [] buffered"}},
		{"PYTHON_EXEC", []string{"prog.py"}, []string{"[0]: wrapped", "[1]: rank 1 of 2 default [] unbuffered"}},
		{"no_python spelling", []string{"--no_python", "python3", "-u", "prog.py"}, []string{"[1]: rank 1 of 2 default [] unbuffered"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(slimerun, append([]string{"-q", "--standalone", "--nproc-per-node", "2"}, tc.args...)...)
			cmd.Dir = dir
			// Unbuffered output must come from -u, not the environment.
			cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "PYTHONUNBUFFERED=") }), "PYTHONPATH="+dir)
			if tc.name == "PYTHON_EXEC" { // the interpreter torchrun's users name
				cmd.Env = append(cmd.Env, "PYTHON_EXEC="+filepath.Join(dir, "wrapped-python"))
			}
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("want %q in:\n%s", w, out)
				}
			}
		})
	}
	t.Run("module and no python", func(t *testing.T) {
		out, err := exec.Command(slimerun, "--standalone", "-m", "--no-python", "pkg.mod").CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "--module") {
			t.Fatalf("%v, want exit 2 naming --module:\n%s", err, out)
		}
	})
}

// --local-ranks-filter, as torchrun's: only the listed local ranks reach
// the console; a teed rank's log still gets its lines; a rank the node
// does not run is refused.
func TestLocalRanksFilter(t *testing.T) {
	dir := t.TempDir()
	out, err := exec.Command(slimerun, "-q", "--standalone", "--nproc-per-node", "3", "--local-ranks-filter", "0,2",
		"--tee", "1", "--log-dir", dir, "--rdzv-id", "filter", "sh", "-c", `echo "hello from $RANK"`).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(string(out), "[0]: hello from 0") || !strings.Contains(string(out), "[2]: hello from 2") || strings.Contains(string(out), "hello from 1") {
		t.Fatalf("want ranks 0 and 2 on the console, not 1:\n%s", out)
	}
	log, err := os.ReadFile(filepath.Join(dir, "filter", "attempt_0", "1", "stdout.log"))
	if err != nil || !strings.Contains(string(log), "hello from 1") {
		t.Fatalf("rank 1's teed log: %q, %v", log, err)
	}
	out, err = exec.Command(slimerun, "--standalone", "--nproc-per-node", "2", "--local-ranks-filter", "0,2", "true").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "--local-ranks-filter") {
		t.Fatalf("%v, want exit 2 naming --local-ranks-filter:\n%s", err, out)
	}
}

// An unmodified torch.distributed script given as torchrun is given it
// (slimerun train.py): it runs under the python3 on PATH, here Debian's,
// which has torch.
func TestTorchScript(t *testing.T) {
	const py = "/usr/bin/python3"
	if out, err := exec.Command(py, "-c", "import torch.distributed").CombinedOutput(); err != nil {
		if os.Getenv("SLIME_REQUIRE_TORCH") == "1" {
			t.Fatalf("SLIME_REQUIRE_TORCH=1 but %s cannot import torch: %v\n%s", py, err, out)
		}
		t.Skipf("no torch for %s: %v", py, err)
	}
	script, err := filepath.Abs("../../launcher/testdata/torch_allgather.py")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(slimerun, "-q", "--standalone", "--nproc-per-node", "2", script, "5")
	cmd.Env = append(os.Environ(), "PATH=/usr/bin:"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "PASS rank 0") || !strings.Contains(string(out), "PASS rank 1") {
		t.Fatalf("%v, want PASS from ranks 0 and 1:\n%s", err, out)
	}
}

// An empty --local-ranks-filter is torchrun's default, no filter (a
// script's --local-ranks-filter "$FILTER" with FILTER unset): it was
// refused as a bad rank.
func TestLocalRanksFilterEmpty(t *testing.T) {
	out, err := exec.Command(slimerun, "-q", "--standalone", "--nproc-per-node", "2", "--local-ranks-filter", "", "sh", "-c", `echo "hello from $RANK"`).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "[0]: hello from 0") || !strings.Contains(string(out), "[1]: hello from 1") {
		t.Fatalf("%v, want both ranks on the console:\n%s", err, out)
	}
}
