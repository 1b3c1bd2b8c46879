//go:build cgo && linux

package kernels

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestPlantedLibraryNotLoaded: the search for libslimecuda.so walks up
// from the working directory to the first go.mod, trying kernels/build at
// each level: from a job's directory in /tmp that reached
// /tmp/kernels/build, which any user of the host can make. dlopen runs a
// library's constructors at once, so a library planted there ran its code
// in every slimego program started below /tmp (a collective's Init with
// the default backend looks for the library), as that program's user:
// root's, for a job run as root. A library found on the search path (not
// named by SLIME_CUDA_LIB) is now loaded only where nobody but this user
// and root can have put it: the file and every directory above it
// belong to one of them and are writable by no one else (a sticky
// directory such as /tmp excepted).
//
// The parent test plays /tmp with a sticky directory of its own, and the
// other user with a kernels/ directory anyone can write (as root, also
// one that uid 65534 owns); a child, in base/job, opens the library.
func TestPlantedLibraryNotLoaded(t *testing.T) {
	if _, err := exec.LookPath("cc"); err != nil {
		t.Skip("no C compiler")
	}
	cases := []string{"writable by others"}
	if os.Geteuid() == 0 {
		cases = append(cases, "another user's")
	}
	for _, tc := range cases {
		t.Run(tc, func(t *testing.T) {
			base := t.TempDir()
			if err := os.Chmod(base, 0o1777); err != nil { // as /tmp
				t.Fatal(err)
			}
			build := filepath.Join(base, "kernels", "build")
			job := filepath.Join(base, "job")
			for _, d := range []string{build, job} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			src := filepath.Join(t.TempDir(), "evil.c")
			marker := filepath.Join(t.TempDir(), "ran")
			if err := os.WriteFile(src, []byte(`#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void evil(void) {
	const char *p = getenv("SLIME_TEST_MARKER");
	FILE *f = p ? fopen(p, "w") : NULL;
	if (f) { fputs("planted code ran\n", f); fclose(f); }
}
`), 0o644); err != nil {
				t.Fatal(err)
			}
			lib := filepath.Join(build, CUDALib)
			if out, err := exec.Command("cc", "-shared", "-fPIC", "-o", lib, src).CombinedOutput(); err != nil {
				t.Fatalf("cc: %v\n%s", err, out)
			}
			switch tc {
			case "writable by others":
				if err := os.Chmod(filepath.Join(base, "kernels"), 0o777); err != nil {
					t.Fatal(err)
				}
			case "another user's":
				for _, p := range []string{filepath.Join(base, "kernels"), build, lib} {
					if err := os.Chown(p, 65534, 65534); err != nil {
						t.Fatal(err)
					}
				}
			}
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Dir = job
			cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "SLIME_CUDA_LIB=") })
			cmd.Env = append(cmd.Env, "SLIME_KERNELS_CHILD=open", "SLIME_TEST_MARKER="+marker)
			out, _ := cmd.CombinedOutput() // the library fails to load either way
			if b, err := os.ReadFile(marker); err == nil {
				t.Fatalf("the library planted at %s was loaded: %q\n%s", lib, b, out)
			}
			if !strings.Contains(string(out), lib) {
				t.Errorf("the error does not name the library passed over:\n%s", out)
			}
			if !strings.Contains(string(out), "[untrusted: true ]") {
				t.Errorf("the error is not ErrUntrusted (which device.Resolve warns of):\n%s", out)
			}
		})
	}
	// This user's own library in a directory of theirs, found the same
	// way, is loaded.
	t.Run("own", func(t *testing.T) {
		emu := os.Getenv("SLIME_CUDA_LIB")
		if emu == "" {
			t.Skip("no library to copy")
		}
		b, err := os.ReadFile(emu)
		if err != nil {
			t.Fatal(err)
		}
		base := t.TempDir()
		build, job := filepath.Join(base, "kernels", "build"), filepath.Join(base, "job")
		for _, d := range []string{build, job} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		lib := filepath.Join(build, CUDALib)
		if err := os.WriteFile(lib, b, 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Dir = job
		cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "SLIME_CUDA_LIB=") })
		cmd.Env = append(cmd.Env, "SLIME_KERNELS_CHILD=open")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "opened "+lib) {
			t.Fatalf("this user's library at %s: %v\n%s", lib, err, out)
		}
	})
}
