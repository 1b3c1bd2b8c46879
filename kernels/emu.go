//go:build linux

package kernels

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
)

// BuildEmulator builds the emulated library (make kernels-emu) in the
// checkout that holds dir (or one of its parents), unless it is up to date,
// and returns its absolute path. Test binaries of several packages may call
// it at once: a lock file serializes the builds, so that none loads a
// library another is still writing. It needs make and a C++20 g++.
func BuildEmulator(dir string) (string, error) {
	root, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(root, "kernels", "emu", "slime_emu.cc")); err == nil {
			break
		}
		up := filepath.Dir(root)
		if up == root {
			return "", fmt.Errorf("%w: no kernels/emu/slime_emu.cc above %s", ErrNotFound, dir)
		}
		root = up
	}
	build := filepath.Join(root, "kernels", "build")
	if err := os.MkdirAll(build, 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(build, ".emu.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("kernels: locking %s: %w", lock.Name(), err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	cmd := exec.Command("make", "-s", "-C", root, "kernels-emu")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("%w: make kernels-emu: %v\n%s", ErrNotFound, err, out)
	}
	return filepath.Join(build, EmuLib), nil
}

// UseEmulator points SLIME_CUDA_LIB at the emulated library, building it
// (BuildEmulator from the working directory), unless the variable already
// names a library: a GPU machine's libslimecuda.so, or a file a child
// process must not find. With devices > 0 the emulator gets that many
// devices unless SLIME_EMU_DEVICES says otherwise. Test binaries call it
// from TestMain so that the CUDA path runs on the host.
func UseEmulator(devices int) error {
	if os.Getenv("SLIME_CUDA_LIB") != "" {
		return nil
	}
	path, err := BuildEmulator(".")
	if err != nil {
		return err
	}
	os.Setenv("SLIME_CUDA_LIB", path)
	if devices > 0 && os.Getenv("SLIME_EMU_DEVICES") == "" {
		os.Setenv("SLIME_EMU_DEVICES", strconv.Itoa(devices))
	}
	return nil
}
