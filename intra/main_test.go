//go:build linux

package intra

import (
	"fmt"
	"os"
	"testing"

	"github.com/slimego/slimego/kernels"
)

// TestMain builds the emulated CUDA library (make kernels-emu) and points
// SLIME_CUDA_LIB at it, unless the variable names a library already (a GPU
// machine's libslimecuda.so): the GPU group's tests then run here, on the
// host. The emulator is given two devices (SLIME_EMU_DEVICES, unless set),
// so that in-process ranks on different GPUs, which need peer access, are
// tested too.
func TestMain(m *testing.M) {
	if err := kernels.UseEmulator(2); err != nil {
		fmt.Fprintln(os.Stderr, "intra tests:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}
