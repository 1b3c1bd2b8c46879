package overlap

import "github.com/slimego/slimego/device"

// BLAS names the implementation the GEMMs of an Op on the CPU backend run
// in (device.BLAS): "gonum" (pure Go, the default) or "openblas" (built
// with -tags openblas).
var BLAS = device.BLAS
