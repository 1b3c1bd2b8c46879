package launcher

import (
	"fmt"
	"os/exec"
	"runtime"

	"golang.org/x/sys/unix"
)

// allowedCPUs is the CPUs this process may run on, in order.
func allowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, err
	}
	var cpus []int
	for c := range 1024 {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}

// startOn starts cmd bound to one CPU: the child inherits the CPU mask of
// the thread that forks it, so this goroutine holds its thread, narrows
// that thread's mask for the fork, and puts it back. (Setting the child's
// mask after the start would race with the threads the child's runtime
// starts, which would keep the old mask.)
func startOn(cmd *exec.Cmd, cpu int) error {
	runtime.LockOSThread()
	var old, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("reading the launcher's CPU mask: %w", err)
	}
	one.Set(cpu)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("binding to CPU %d: %w", cpu, err)
	}
	err := cmd.Start()
	if e := unix.SchedSetaffinity(0, &old); e != nil {
		// The thread stays locked to this goroutine, out of the runtime's
		// use with its narrowed mask; the job fails.
		if err == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
		return fmt.Errorf("restoring the launcher's CPU mask: %w", e)
	}
	runtime.UnlockOSThread()
	return err
}
