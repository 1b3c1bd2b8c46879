//go:build openblas

package device

import (
	"gonum.org/v1/gonum/blas/blas32"
	"gonum.org/v1/gonum/blas/blas64"
	"gonum.org/v1/netlib/blas/netlib"
)

// Built with -tags openblas (and CGO_LDFLAGS=-lopenblas), the CPU
// backend's GEMMs run in OpenBLAS through gonum's netlib binding instead of
// gonum's pure Go.
func init() {
	blas32.Use(netlib.Implementation{})
	blas64.Use(netlib.Implementation{})
	BLAS = "openblas"
}
