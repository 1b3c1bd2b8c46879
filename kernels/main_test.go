//go:build cgo && linux

package kernels

import (
	"fmt"
	"os"
	"testing"
)

// maxConnSet: whether CUDA_DEVICE_MAX_CONNECTIONS was set before the
// library loaded.
var maxConnSet bool

// TestMain builds the emulated library (make kernels-emu) and points
// SLIME_CUDA_LIB at it, unless the variable names a library already (a GPU
// machine's libslimecuda.so): every test of the package then runs on it.
// A child process re-executed by a test runs its part instead.
func TestMain(m *testing.M) {
	_, maxConnSet = os.LookupEnv("CUDA_DEVICE_MAX_CONNECTIONS")
	if child := os.Getenv("SLIME_KERNELS_CHILD"); child != "" {
		os.Exit(runChild(child))
	}
	if os.Getenv("SLIME_CUDA_LIB") == "" {
		path, err := BuildEmulator(".")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Setenv("SLIME_CUDA_LIB", path)
	}
	os.Exit(m.Run())
}
