// Package cpustat tells how busy this machine's processors were over an
// interval, so that a benchmark can show how much of the machine a piece of
// work occupies: where the network is the kernel copying bytes,
// communication competes with computation for the same cores. Busy time is
// not all work: a thread that waits by spinning counts as busy.
package cpustat

import (
	"bufio"
	"bytes"
	"strconv"
	"time"
)

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

// userHZ is the unit of /proc/stat's times: USER_HZ, 100 on every Linux
// architecture Go runs on.
const userHZ = 100

// parse reads the text of /proc/stat taken at the given time: the
// aggregate line's idle and iowait fields, and one cpuN line per online
// processor.
func parse(b []byte, at time.Time) (Sample, bool) {
	s := Sample{at: at}
	found := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) == 0 || !bytes.HasPrefix(f[0], []byte("cpu")) {
			continue
		}
		if len(f[0]) > 3 {
			s.cpus++
			continue
		}
		if len(f) < 6 {
			return Sample{}, false
		}
		var ticks int64
		for _, x := range f[4:6] { // idle, iowait
			v, err := strconv.ParseInt(string(x), 10, 64)
			if err != nil {
				return Sample{}, false
			}
			ticks += v
		}
		s.idle = time.Duration(ticks) * (time.Second / userHZ)
		found = true
	}
	return s, found && s.cpus > 0
}
