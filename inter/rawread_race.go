//go:build race

package inter

import "syscall"

// rawRead is read(2) through the syscall package under the race
// detector: its Read orders the caller after every write made through
// the standard library (a net.Conn's, a test's fake peer's), as a
// net.Conn's Read does, where the raw system call would not.
func rawRead(fd int, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, err := syscall.Read(fd, p)
	return max(n, 0), err
}
