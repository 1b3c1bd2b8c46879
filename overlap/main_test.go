//go:build linux

package overlap

import (
	"fmt"
	"os"
	"testing"

	"github.com/slimego/slimego/device"
)

// TestMain builds the emulated CUDA library (make kernels-emu) and points
// SLIME_CUDA_LIB at it, unless the variable names a library already (a GPU
// machine's libslimecuda.so, or the file a child process must not find):
// the CUDA tests then run here, on the host, through the same loader.
func TestMain(m *testing.M) {
	if err := device.UseEmulator(0); err != nil {
		fmt.Fprintln(os.Stderr, "overlap tests:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}
