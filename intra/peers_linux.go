package intra

import (
	"golang.org/x/sys/unix"
)

type pollFD = unix.PollFd

const pollIn = unix.POLLIN

func pidfdOpen(pid int) (int, error) { return unix.PidfdOpen(pid, 0) }

func closeFD(fd int) { unix.Close(fd) }

// exited returns the index in fds of a process that has exited, or -1.
func exited(fds []unix.PollFd) int {
	if len(fds) == 0 {
		return -1
	}
	n, err := unix.Poll(fds, 0)
	if err != nil || n == 0 {
		return -1
	}
	for i := range fds {
		if fds[i].Revents != 0 {
			return i
		}
	}
	return -1
}

func schedYield() { unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
