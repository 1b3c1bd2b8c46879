package bench

import (
	"time"

	"github.com/slimego/slimego/internal/interleave"
)

// Memcpy measures one core's copy bandwidth for n-byte copies between two
// buffers allocated and touched once (so that no first-touch cost is
// timed): the ceiling a shared-memory all-gather, which copies, works under.
// It returns the median time of one copy (µs) and its bandwidth (GB/s).
func Memcpy(n int, minTime time.Duration) (us, gbps float64) {
	if n == 0 {
		return 0, 0
	}
	a, b := make([]byte, n), make([]byte, n)
	for i := range a {
		a[i] = byte(i*7 + 1)
	}
	copy(b, a)
	var times []float64
	start := time.Now()
	for len(times) < 5 || time.Since(start) < minTime {
		t0 := time.Now()
		copy(b, a)
		times = append(times, float64(time.Since(t0).Nanoseconds())/1e3)
		if len(times) >= 1_000_000 {
			break
		}
	}
	us = interleave.Median(times)
	if us > 0 {
		gbps = float64(n) / (us * 1e-6) / 1e9
	}
	return us, gbps
}
