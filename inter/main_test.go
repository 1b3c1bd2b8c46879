//go:build linux

package inter

import (
	"fmt"
	"os"
	"testing"

	"github.com/slimego/slimego/kernels"
)

// TestMain builds the emulated CUDA library and points SLIME_CUDA_LIB at
// it, unless the variable names a library already (a GPU machine's
// libslimecuda.so), so that the GPU link (Staged) and the algorithms over
// the CUDA LL group run here, on the host; the emulator has two devices
// (SLIME_EMU_DEVICES, unless set). The other tests do not touch it.
func TestMain(m *testing.M) {
	if err := kernels.UseEmulator(2); err != nil {
		fmt.Fprintln(os.Stderr, "inter tests:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}
