//go:build !race

package inter

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// rawRead is read(2) on a non-blocking socket, which returns at once, so
// without the runtime's system-call bookkeeping (entersyscall and
// exitsyscall, and the monitor's hand-off of a processor that a system
// call holds), which a tight loop of them would pay on every try.
func rawRead(fd int, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}
