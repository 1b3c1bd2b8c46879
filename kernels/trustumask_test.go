package kernels

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestTrustedLibOwnGroupWritable: a library this user built under umask
// 002 (the default for a user whose group is their own: Debian's and
// Fedora's USERGROUPS_ENAB) is mode 0775 in directories of mode 0775, all
// of this process's group. The directories were accepted (a group of the
// process's own) but the file was refused as "others can change" it, so
// that `make kernels` in a checkout left the GPU library unloadable.
func TestTrustedLibOwnGroupWritable(t *testing.T) {
	base := t.TempDir()
	build := filepath.Join(base, "kernels", "build")
	if err := os.MkdirAll(build, 0o775); err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(build, CUDALib)
	if err := os.WriteFile(lib, []byte("not really a library"), 0o775); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(base, "kernels"), build, lib} {
		if err := os.Chmod(p, 0o775); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, -1, os.Getegid()); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := trustedLib(lib); err != nil || got != lib {
		t.Fatalf("trustedLib(%s) = %q, %v; want it trusted, as its directories are", lib, got, err)
	}
	// Writable by a group that is not this process's own: refused, as a
	// directory would be.
	if os.Geteuid() == 0 {
		if err := os.Chown(lib, -1, 65534); err != nil {
			t.Fatal(err)
		}
		if _, err := trustedLib(lib); err == nil {
			st, _ := os.Stat(lib)
			t.Fatalf("trustedLib accepted %s, writable by group %d", lib, st.Sys().(*syscall.Stat_t).Gid)
		}
	}
}
