//go:build linux

package bench

import (
	"fmt"
	"os"
	"testing"

	"github.com/slimego/slimego/device"
)

// TestMain builds the emulated CUDA library and points SLIME_CUDA_LIB at
// it, unless the variable names a library already (a GPU machine's
// libslimecuda.so), so that the sweep's GPU path runs here too. Tests that
// leave the backend at auto still get the CPU backend (device.Resolve
// never picks the emulator).
func TestMain(m *testing.M) {
	if err := device.UseEmulator(0); err != nil {
		fmt.Fprintln(os.Stderr, "bench tests:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}
