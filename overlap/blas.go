package overlap

// BLAS names the implementation the GEMMs run in: "gonum" (pure Go, the
// default) or "openblas" (built with -tags openblas).
var BLAS = "gonum"
