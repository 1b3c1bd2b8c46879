package kernels

import (
	"os"
	"path/filepath"
	"testing"
)

// TestCandidatesOnce: each place is tried, and named in the error that
// lists them, once, though the executable's folders and the working
// directory's reach the same kernels/build (a checkout's bin/slimerun run
// from the checkout listed its kernels/build twice).
func TestCandidatesOnce(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("SLIME_TEST_NO_LIB", "")
	t.Chdir(filepath.Dir(filepath.Dir(exe))) // the executable's parent: its ../kernels/build is the working directory's
	seen := map[string]bool{}
	c := candidates("libnothing.so", "SLIME_TEST_NO_LIB")
	for _, p := range c {
		if seen[p] {
			t.Errorf("%s listed twice: %q", p, c)
		}
		seen[p] = true
	}
	if want := filepath.Join(filepath.Dir(exe), "libnothing.so"); c[0] != want || c[len(c)-1] != "libnothing.so" {
		t.Errorf("%q: want %s first and the loader's own search last", c, want)
	}
}
