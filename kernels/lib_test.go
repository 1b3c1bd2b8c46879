//go:build cgo && linux

package kernels

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The library, where make kernels built it, loads and answers; on a machine
// without a GPU its first device call says so.
func TestOpenAndCount(t *testing.T) {
	lib, err := Open()
	if errors.Is(err, ErrNotFound) {
		t.Skipf("libslimecuda.so not built here (make kernels): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	n, err := lib.DeviceCount()
	if err != nil {
		if !errors.Is(err, ErrNoDevice) {
			t.Fatalf("no GPU here, but the error is not ErrNoDevice: %v", err)
		}
		if !strings.Contains(err.Error(), "slime_device_count") {
			t.Errorf("error does not name the call: %v", err)
		}
		t.Logf("library %s loaded; no GPU: %v", lib.Path(), err)
		return
	}
	name, err := lib.DeviceName(0)
	if err != nil || name == "" {
		t.Fatalf("device 0 name %q: %v", name, err)
	}
	drv, rt, err := lib.Versions()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d GPU(s), device 0 %s, driver %d runtime %d", n, name, drv, rt)
}

// A library that is not there is ErrNotFound naming the path and the
// variable that sets it.
func TestLoadMissing(t *testing.T) {
	t.Setenv("SLIME_TEST_LIB", "/nonexistent/libslimecuda.so")
	_, err := load(CUDALib, "SLIME_TEST_LIB", false)
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("err = %v, want ErrNotFound", err)
	}
	for _, want := range []string{"/nonexistent/libslimecuda.so", "SLIME_TEST_LIB", "make kernels"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// A library without the ABI's symbols is refused, naming the first missing one.
func TestLoadWrongLibrary(t *testing.T) {
	t.Setenv("SLIME_TEST_LIB", "libc.so.6")
	_, err := load(CUDALib, "SLIME_TEST_LIB", false)
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "missing symbol slime_last_error") {
		t.Fatalf("err = %v, want a missing symbol", err)
	}
}

// A library of another ABI version is refused as such, whatever symbols it
// lacks: the error names the version and says to rebuild it. The library is
// built here, with the host's C compiler, exporting slime_abi_version alone.
func TestLoadOtherABIVersion(t *testing.T) {
	var cc string
	for _, c := range []string{os.Getenv("CC"), "cc", "gcc"} {
		if c == "" {
			continue
		}
		if p, err := exec.LookPath(c); err == nil {
			cc = p
			break
		}
	}
	if cc == "" {
		t.Skip("no C compiler here to build a library of another ABI version")
	}
	dir := t.TempDir()
	src, so := filepath.Join(dir, "old.c"), filepath.Join(dir, "libslimecuda-old.so")
	if err := os.WriteFile(src, []byte("int slime_abi_version(void) { return 2; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-o", so, src).CombinedOutput(); err != nil {
		t.Skipf("%s cannot build a shared library here: %v\n%s", cc, err, out)
	}
	t.Setenv("SLIME_TEST_LIB", so)
	_, err := load(CUDALib, "SLIME_TEST_LIB", false)
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("err = %v, want ErrNotFound", err)
	}
	for _, want := range []string{so, "ABI version 2", "rebuild it"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}
