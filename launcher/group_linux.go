package launcher

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/slimego/slimego/internal/machine"
)

// A worker is the leader of its own process group (Setsid), whose id is
// the worker's pid; its children, and theirs, stay in the group unless
// they leave it (setsid, a shell's job control). The kernel does not give
// a process id to a new process while a group of that id has members, but
// once the last member is gone the id is free again, and a stranger that
// gets it as its pid can lead a group of that id. The launcher therefore
// does not reap a worker (which would free its pid once the rest of the
// group is gone) until it has dealt with the worker's group: waitExited
// learns of the exit without reaping, the zombie leader keeps the group's
// id the job's, and signals to the group reach only the job's processes.

// Codes of a SIGCHLD's siginfo (<signal.h>), which x/sys/unix does not name.
const (
	cldExited = 1
	cldKilled = 2
	cldDumped = 3
)

// chldInfo is the start of a siginfo_t as waitid fills it for a child:
// signo, errno, code, then (in a union aligned for a pointer) the child's
// pid, uid and status.
type chldInfo struct {
	signo, errno, code int32
	_                  [0]uintptr
	pid                int32
	uid                uint32
	status             int32
}

// waitExited blocks until child pid has exited and returns its wait
// status, leaving it a zombie for cmd.Wait to reap (WNOWAIT): see above.
func waitExited(pid int) (syscall.WaitStatus, error) {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("waitid %d: %w", pid, err)
		}
		break
	}
	c := (*chldInfo)(unsafe.Pointer(&info))
	switch c.code {
	case cldExited:
		return syscall.WaitStatus((c.status & 0xff) << 8), nil
	case cldKilled:
		return syscall.WaitStatus(c.status & 0x7f), nil
	case cldDumped:
		return syscall.WaitStatus(c.status&0x7f | 0x80), nil
	}
	return 0, fmt.Errorf("waitid %d: unexpected si_code %d", pid, c.code)
}

// groupMembers returns, for each worker's group and session (both of
// id the worker's pid: a worker leads the two), the pids of its live
// members (not zombies: a zombie whose threads still run, its main thread
// gone, is alive), less the worker itself unless leaders, by reading
// /proc: what the workers left behind once they have exited (the guard
// counts a leader that still runs too). A member of the session in a
// group of its own (a script's job control: bash's set -m) counts as its
// worker's; groups lists the process groups of all of them, the workers'
// own included, which the caller signals (kill(-pgid): a group with a live
// member keeps its id, and a group lies within one session). A process
// that left the session (setsid) is not the job's any more.
func groupMembers(workers []int, leaders bool) (left map[int][]int, groups []int, err error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, nil, err
	}
	left = make(map[int][]int)
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		f, ok := machine.StatFields(b) // state ppid pgrp session ...
		if !ok {
			continue
		}
		if len(f) < 4 || f[0] == "X" || f[0] == "Z" && !machine.Alive(pid) {
			continue
		}
		pgrp, err1 := strconv.Atoi(f[2])
		sid, err2 := strconv.Atoi(f[3])
		if err1 != nil || err2 != nil {
			continue
		}
		w := sid
		if !slices.Contains(workers, w) {
			w = pgrp // in a worker's group, though not its session
			if !slices.Contains(workers, w) {
				continue
			}
		}
		if pid == w && !leaders {
			continue
		}
		left[w] = append(left[w], pid)
		if !slices.Contains(groups, pgrp) {
			groups = append(groups, pgrp)
		}
	}
	return left, groups, nil
}
