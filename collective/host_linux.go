package collective

import (
	"os"
	"runtime"
	"strconv"
	"strings"
)

// hostID names the machine this process runs on: its kernel's boot id, the
// same in every network namespace and container of the machine, so that
// nodes that share one machine's cores (namespaces standing in for nodes,
// containers) find each other. "-" where it cannot be read or is not one.
func hostID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	s := strings.TrimSpace(string(b))
	if err != nil || s == "-" || !validHostID(s) {
		return "-"
	}
	return s
}

// hostCPUs is the number of the machine's CPUs that are online (not this
// process's affinity mask: ranks of other nodes on the machine may run on
// the others), or runtime.NumCPU where that cannot be read.
func hostCPUs() int {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if n := countCPUList(strings.TrimSpace(string(b))); err == nil && n > 0 {
		return n
	}
	return runtime.NumCPU()
}

// countCPUList counts the CPUs of a kernel CPU list ("0-3,8,10-11"), or
// returns 0 for one it cannot read.
func countCPUList(s string) int {
	n := 0
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return 0
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a || b-a > 1<<20 {
				return 0
			}
		}
		n += b - a + 1
	}
	return n
}
