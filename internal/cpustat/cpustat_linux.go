package cpustat

import (
	"os"
	"time"
)

// now reads /proc/stat.
func now() (Sample, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return Sample{}, false
	}
	return parse(b, time.Now())
}
