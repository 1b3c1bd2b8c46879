// Package cpustat tells how busy this machine's processors were over an
// interval, so that a benchmark can say how much of a figure is the CPU's
// doing: on a machine whose network is the kernel copying bytes, a
// transfer that keeps every core busy leaves no time for a computation to
// hide in.
package cpustat

import "time"

// Sample is the machine's cumulative idle processor time at one instant.
type Sample struct {
	idle time.Duration // summed over processors
	cpus int
	at   time.Time
}

// Now samples the machine; ok is false where the platform does not tell.
func Now() (s Sample, ok bool) { return now() }

// Busy is the fraction of the processors' time between a and b that was
// not idle, from 0 to 1. The idle time is kept by the kernel to the
// nanosecond but reported in 10 ms units, so intervals of a second or more
// give figures good to about 1%.
func Busy(a, b Sample) float64 {
	wall := b.at.Sub(a.at) * time.Duration(max(a.cpus, 1))
	if wall <= 0 {
		return 0
	}
	return min(max(1-float64(b.idle-a.idle)/float64(wall), 0), 1)
}
