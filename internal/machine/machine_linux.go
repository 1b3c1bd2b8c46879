// Package machine names the machine a process runs on and counts its
// processors and memory, as every network namespace and container of the
// machine sees them alike: so that processes that share one machine
// (nodes that are namespaces or containers, peers on one host) can find
// each other, and a program can refuse a size it has no memory for.
package machine

import (
	"errors"
	"io/fs"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
)

// BootID is the kernel's boot id (a UUID, the same in every namespace of
// the machine, new at every boot), or "" where it cannot be read.
func BootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// MaxID bounds a machine name read from another process (a boot id is 36
// bytes).
const MaxID = 64

// ValidID says whether s, read from another process (the store, the
// wire), can name a machine: "-" (none) or at most MaxID bytes of
// [0-9a-f-].
func ValidID(s string) bool {
	if s == "-" {
		return true
	}
	if s == "" || len(s) > MaxID {
		return false
	}
	for _, c := range []byte(s) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || c == '-') {
			return false
		}
	}
	return true
}

// ID names this machine for other processes: its boot id, or "-" where
// that cannot be read or is not a ValidID.
func ID() string {
	s := BootID()
	if s == "" || !ValidID(s) {
		return "-"
	}
	return s
}

// OnlineCPUs is the number of the machine's processors that are online
// (not this process's affinity mask: other processes of the machine may
// run on the others), or runtime.NumCPU where that cannot be read.
func OnlineCPUs() int {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if n := CountCPUList(strings.TrimSpace(string(b))); err == nil && n > 0 {
		return n
	}
	return runtime.NumCPU()
}

// CountCPUList counts the processors of a kernel CPU list ("0-3,8,10-11"),
// or returns 0 for one it cannot read.
func CountCPUList(s string) int {
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

// Memory is the machine's memory available without swapping and its
// total (/proc/meminfo's MemAvailable and MemTotal), in bytes; ok is false
// where they cannot be read.
func Memory() (avail, total int64, ok bool) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, 0, false
	}
	var seen int
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil || kb < 0 || kb > 1<<50 {
			continue
		}
		switch f[0] {
		case "MemAvailable:":
			avail, seen = kb<<10, seen|1
		case "MemTotal:":
			total, seen = kb<<10, seen|2
		}
	}
	return avail, total, seen == 3
}

// Alive says whether process pid of this pid namespace runs: it exists
// and is not a zombie, or is a zombie whose threads still run (its main
// thread exited alone; the process lives until its last thread ends).
func Alive(pid int) bool {
	if pid <= 0 || syscall.Kill(pid, 0) == syscall.ESRCH {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		// Gone only where the kernel says so: out of descriptors, or
		// under a /proc that hides other users' processes (hidepid,
		// whose entries read as missing), the process that kill found
		// is still there. A missing entry is asked of kill again (the
		// process may have exited in between).
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			return syscall.Kill(pid, 0) != syscall.ESRCH
		}
		return true
	}
	zombie, threads := false, 0
	for l := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "State:"); ok {
			zombie = strings.HasPrefix(strings.TrimSpace(v), "Z") || strings.HasPrefix(strings.TrimSpace(v), "X")
		}
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			threads, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return !zombie || threads > 1
}

// PIDSpace names this machine and pid namespace (the boot id and the
// namespace's link): processes that share it see each other's pids, so
// that a pid one of them publishes means the same process to the other.
// It is "" where either cannot be read: the namespace's link alone (the
// initial one's is the same on every machine) names no machine, and ""
// is never taken for a match (SamePIDSpace).
func PIDSpace() string {
	ns, err := os.Readlink("/proc/self/ns/pid")
	boot := BootID()
	if err != nil || ns == "" || boot == "" {
		return ""
	}
	return boot + "/" + ns
}

// SamePIDSpace reports whether a and b, PIDSpace values of two processes,
// name one machine and pid namespace: equal, and not "".
func SamePIDSpace(a, b string) bool { return a != "" && a == b }

// StatFields returns the fields of a /proc/PID/stat text from the third
// on (state, ppid, pgrp, …: field n is at n-3), counted after the last
// ')' because the command name (the second) may hold spaces and
// parentheses; ok false where there is none.
func StatFields(b []byte) (fields []string, ok bool) {
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return nil, false
	}
	return strings.Fields(string(b[i+1:])), true
}
