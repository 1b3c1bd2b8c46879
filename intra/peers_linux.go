package intra

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

type pollFD = unix.PollFd

const pollIn = unix.POLLIN

func pidfdOpen(pid int) (int, error) { return unix.PidfdOpen(pid, 0) }

func closeFD(fd int) { unix.Close(fd) }

// cpusOf counts the CPUs that any process of pids may run on (the union
// of their CPU masks), or returns 0 if a mask cannot be read. Ranks bound
// to one CPU each (slimerun --bind-to core, mpirun) see one CPU in their
// own mask and in runtime.NumCPU, but do not outnumber the cores they
// share: their union does not.
func cpusOf(pids []int) int {
	var all unix.CPUSet
	for _, pid := range pids {
		var set unix.CPUSet
		if unix.SchedGetaffinity(pid, &set) != nil {
			return 0
		}
		for i := range all {
			all[i] |= set[i]
		}
	}
	return all.Count()
}

// watchExits aborts the store's waits under prefix, naming the rank,
// when a peer's process exits while the group meets in the store (Alloc:
// the sizes, the segment's name). The store knows nothing of processes:
// under slimerun the launcher aborts the attempt's waits when a worker
// exits, but under another launcher (srun, mpirun) nothing would, and the
// other ranks would wait out their timeout for a rank that is gone. stop
// ends the watch and waits for it. Peers in this process have no pidfd:
// nothing to watch.
func (g *Group) watchExits(prefix string) (stop func()) {
	var fds []pollFD
	var ranks []int
	for p, fd := range g.pidfds {
		if fd >= 0 {
			fds = append(fds, pollFD{Fd: int32(fd), Events: pollIn})
			ranks = append(ranks, p)
		}
	}
	var wake [2]int
	if len(fds) == 0 || g.cfg.Store == nil || unix.Pipe2(wake[:], unix.O_CLOEXEC) != nil {
		return func() {}
	}
	// stop closes the pipe's write end, which the poll sees on the read
	// end (a write could fail; a close always wakes it).
	fds = append(fds, pollFD{Fd: int32(wake[0]), Events: pollIn})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			_, err := unix.Poll(fds, -1)
			if err == unix.EINTR {
				continue
			}
			if err != nil || fds[len(fds)-1].Revents != 0 {
				return
			}
			for i := range ranks {
				if fds[i].Revents != 0 {
					// On a connection of its own: this rank's wait
					// holds the group's until it ends.
					p := g.global(ranks[i])
					ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
					if st, err := g.cfg.Store.Redial(ctx); err == nil {
						st.Abort(ctx, prefix, p, fmt.Sprintf("rank %d's process exited", p))
						st.Close()
					}
					cancel()
					return
				}
			}
		}
	})
	return func() {
		unix.Close(wake[1])
		wg.Wait()
		unix.Close(wake[0])
	}
}

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

// schedYield gives up the processor to another thread that wants it. It
// is made without the runtime's system-call bookkeeping, whose entry
// wakes the runtime's monitor thread when that sleeps: a futex wake-up
// and one more thread to run, on a machine whose ranks already outnumber
// its cores, at every yield.
func schedYield() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }

type (
	iovec       = unix.Iovec
	remoteIovec = unix.RemoteIovec
)

// probeCMA reports whether process_vm_readv reads every peer's memory: it
// reads each peer's pid, as watchPeers took it, from the peer's own
// address space.
func (g *Group) probeCMA() bool {
	for p, c := range g.ctrls {
		if p == g.rank {
			continue
		}
		pid := uint32(g.pids[p])
		var got uint32
		local := []unix.Iovec{{Base: (*byte)(unsafe.Pointer(&got)), Len: 4}}
		remote := []unix.RemoteIovec{{Base: uintptr(atomic.LoadUint64(&c.self)), Len: 4}}
		n, err := unix.ProcessVMReadv(int(pid), local, remote, 0)
		if err != nil || n != 4 || got != pid {
			return false
		}
	}
	return true
}

// cmaRead copies len(dst) bytes at addr in peer p's address space into dst:
// the process whose pid watchPeers took at Init (and watches), not
// whatever the peer's control block says now (its memory is the peer's to
// write: a pid written there later would point the read at another
// process).
func (g *Group) cmaRead(p int, dst []byte, addr uint64) error {
	pid := g.pids[p]
	for done := 0; done < len(dst); {
		g.iov[0].Base = &dst[done]
		g.iov[0].SetLen(len(dst) - done)
		g.riov[0] = unix.RemoteIovec{Base: uintptr(addr) + uintptr(done), Len: len(dst) - done}
		n, err := unix.ProcessVMReadv(pid, g.iov[:], g.riov[:], 0)
		if err != nil {
			if err == unix.EINTR {
				continue
			}
			return err
		}
		if n == 0 {
			return fmt.Errorf("process_vm_readv read nothing at %#x", addr+uint64(done))
		}
		done += n
	}
	return nil
}
