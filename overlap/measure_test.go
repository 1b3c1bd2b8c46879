package overlap

import (
	"math"
	"testing"
)

// TestBound: the efficiency the processors leave room for, at the corners
// and in between.
func TestBound(t *testing.T) {
	for _, tc := range []struct {
		name string
		t    Times
		want float64
	}{
		{"unmeasured", Times{Comm: 100, GEMM: 100}, 1},
		{"idle link, busy GEMM: all hidden", Times{Comm: 100, GEMM: 100, CommCPU: 0, GEMMCPU: 1e-9}, 1},
		{"both saturate the machine: nothing hidden", Times{Comm: 100, GEMM: 100, CommCPU: 1, GEMMCPU: 1}, 0},
		{"comm uses 70%, GEMM all", Times{Comm: 100, GEMM: 100, CommCPU: 0.7, GEMMCPU: 1}, 0.3},
		{"long GEMM swallows a light gather", Times{Comm: 50, GEMM: 200, CommCPU: 0.5, GEMMCPU: 0.5}, 1},
		{"long GEMM, heavy gather", Times{Comm: 50, GEMM: 200, CommCPU: 0.8, GEMMCPU: 0.9}, 0.6},
	} {
		if got := tc.t.Bound(); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: Bound() = %v, want %v", tc.name, got, tc.want)
		}
	}
}
