// Package futex sleeps on and wakes 32-bit words in shared memory, across
// processes (shared futexes, not FUTEX_PRIVATE).
package futex

import (
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	futexWait = 0
	futexWake = 1
)

// Wait sleeps while *addr == val, for at most d. It returns on a wake, a
// value change, a signal or the timeout; the caller re-checks its condition.
func Wait(addr *uint32, val uint32, d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWait, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// Wake wakes up to n sleepers on addr.
func Wake(addr *uint32, n int) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWake, uintptr(n), 0, 0, 0)
}
