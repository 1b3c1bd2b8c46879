//go:build linux

package intra

import (
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strconv"
	"testing"

	"github.com/slimego/slimego/kernels"
)

// TestMain builds the emulated CUDA library (make kernels-emu) and points
// SLIME_CUDA_LIB at it, unless the variable names a library already (a GPU
// machine's libslimecuda.so): the GPU group's tests then run here, on the
// host. The emulator is given two devices (SLIME_EMU_DEVICES, unless set),
// so that in-process ranks on different GPUs, which need peer access, are
// tested too. A child process re-executed by a test (SLIME_INTRA_CHILD)
// runs its part instead.
func TestMain(m *testing.M) {
	if err := kernels.UseEmulator(2); err != nil {
		fmt.Fprintln(os.Stderr, "intra tests:", err)
		os.Exit(1)
	}
	if n := os.Getenv("SLIME_INTRA_CHILD_EXPORT"); n != "" {
		os.Exit(exportChild(n))
	}
	os.Exit(m.Run())
}

// exportChild allocates n bytes of device memory on device 0, prints its
// CUDA IPC handle in hex, and keeps it until its stdin closes: another
// process's allocation, which only a peer in another process has.
func exportChild(n string) int {
	bytes, err := strconv.ParseUint(n, 10, 64)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	lib, err := kernels.Open()
	if err != nil {
		fmt.Println(err)
		return 1
	}
	p, err := lib.Malloc(0, bytes)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer lib.Free(0, p)
	h, err := lib.IPCHandle(0, p)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	fmt.Println(hex.EncodeToString(h[:]))
	io.Copy(io.Discard, os.Stdin)
	return 0
}
