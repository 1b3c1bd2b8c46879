//go:build !cgo || !linux

package topology

import "fmt"

func readGPUs(t *Topology) error {
	return fmt.Errorf("%w: this build has no cgo, which NVML needs", ErrNoNVML)
}
