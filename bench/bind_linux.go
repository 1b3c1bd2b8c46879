package bench

import "golang.org/x/sys/unix"

// bindThread binds the calling OS thread (locked by the caller) to the
// i-th of the CPUs this process may use, if there are at least n of them,
// and returns what puts its mask back.
func bindThread(i, n int) (restore func()) {
	var old unix.CPUSet
	if unix.SchedGetaffinity(0, &old) != nil || old.Count() < n {
		return func() {}
	}
	for c, k := 0, 0; c < len(old)*64; c++ {
		if !old.IsSet(c) {
			continue
		}
		if k == i {
			var one unix.CPUSet
			one.Set(c)
			if unix.SchedSetaffinity(0, &one) != nil {
				return func() {}
			}
			return func() { unix.SchedSetaffinity(0, &old) }
		}
		k++
	}
	return func() {}
}
