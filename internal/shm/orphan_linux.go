package shm

import (
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/slimego/slimego/internal/machine"
)

var (
	tagOnce sync.Once
	tagVal  string
	tagErr  error
)

// ownerTag is "o<pid>.<start time>" for this process: the start time (in
// clock ticks since boot, /proc/<pid>/stat field 22) tells this process
// from a later one that reuses its pid.
func ownerTag() (string, error) {
	tagOnce.Do(func() {
		var start uint64
		start, tagErr = startTime("self")
		tagVal = fmt.Sprintf("o%d.%d", os.Getpid(), start)
	})
	return tagVal, tagErr
}

// startTime reads field 22 of /proc/<pid>/stat. The second field, the
// command name, may hold spaces and parentheses, so fields are counted
// from the last ')'.
//
// A process that has exited but is not reaped yet (a zombie, as a killed
// launcher's workers are until init reaps them) counts as gone: an error
// for which os.IsNotExist holds. It holds no files, and its pid is not
// given out again until it is reaped. A zombie whose other threads still
// run (machine.Alive) is alive.
func startTime(pid string) (uint64, error) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, err
	}
	if f, ok := machine.StatFields(b); ok && len(f) > 0 && f[0] == "Z" {
		if n, err := strconv.Atoi(pid); err == nil && !machine.Alive(n) {
			return 0, fs.ErrNotExist
		}
	}
	return parseStartTime(pid, b)
}

// parseStartTime reads field 22 of the text of /proc/<pid>/stat.
func parseStartTime(pid string, b []byte) (uint64, error) {
	f, ok := machine.StatFields(b)
	if !ok {
		return 0, fmt.Errorf("shm: /proc/%s/stat: no command name", pid)
	}
	// f[0] is field 3 (state), so field 22 is f[19].
	if len(f) < 20 {
		return 0, fmt.Errorf("shm: /proc/%s/stat: %d fields", pid, len(f)+2)
	}
	v, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("shm: /proc/%s/stat: start time: %w", pid, err)
	}
	return v, nil
}

// ownerRE finds the owner tag that NewName puts before the nonce.
var ownerRE = regexp.MustCompile(`-o([0-9]{1,10})\.([0-9]{1,20})-[0-9a-f]+$`)

// SweepOrphans removes the segments that outlived the process that created
// them: names that start with Prefix and carry an owner tag (NewName),
// regular files owned by this user, that no process holds (no Segment has
// it open: the sweep takes the file's exclusive lock without waiting) and
// whose creator no longer runs or whose pid now belongs to a process
// started at another time. A killed launcher's workers die before the last
// of them maps (and unlinks) a segment; this is what removes it later.
// Names without a tag are left alone.
//
// Both tests are needed. The lock is what protects a segment across pid
// namespaces (containers sharing /dev/shm see each other's pids as gone or
// reused). The pid tag covers the moment between the creator's open and
// its lock, within one namespace.
func SweepOrphans() (removed []string, err error) {
	entries, err := os.ReadDir(Dir)
	if err != nil {
		return nil, fmt.Errorf("shm: sweep: %w", err)
	}
	uid := uint32(os.Geteuid())
	alive := map[string]uint64{} // pid -> start time, or ^0 when gone
	known := func(pid string) (start uint64, ok bool) {
		got, seen := alive[pid]
		if !seen {
			got = ^uint64(0)
			if s, err := startTime(pid); err == nil {
				got = s
			} else if !os.IsNotExist(err) && err != syscall.ESRCH {
				return 0, false // cannot tell
			}
			alive[pid] = got
		}
		return got, true
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, sweepPrefix) || !e.Type().IsRegular() {
			continue
		}
		m := ownerRE.FindStringSubmatch(name)
		if m == nil {
			continue
		}
		pid, start := m[1], m[2]
		want, err := strconv.ParseUint(start, 10, 64)
		if err != nil {
			continue
		}
		// The pid, first without the lock (most names are live, and a
		// cheap look keeps the sweep from taking their locks), then again
		// under it.
		if got, ok := known(pid); !ok || got == want {
			continue
		}
		gone := func() bool { // under the lock, afresh
			got, err := startTime(pid)
			if err != nil {
				return os.IsNotExist(err) || err == syscall.ESRCH
			}
			return got != want
		}
		var st unix.Stat_t
		if unix.Lstat(Dir+"/"+name, &st) != nil || st.Uid != uid || st.Mode&unix.S_IFMT != unix.S_IFREG {
			continue
		}
		if removeUnheld(name, gone) {
			removed = append(removed, name)
		}
	}
	return removed, nil
}

// sweepPrefix is what SweepOrphans looks at: Prefix, except in this
// package's tests, whose forged segments other test binaries' sweeps must
// not see (and whose sweeps must not see theirs).
var sweepPrefix = Prefix
