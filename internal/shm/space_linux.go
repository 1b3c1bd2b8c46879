package shm

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// cgroupRoot is where cgroup file systems are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// A room is one bound on how much shared memory can be made now.
type room struct {
	what  string // which limit, for people
	bytes int64
}

// CheckSpace refuses, with ErrNoSpace, a segment of size bytes that the
// free space of Dir, the node's available memory (MemAvailable) or this
// process's cgroup memory limit (memory.max less memory.current, at every
// level up to the root; v1's limit_in_bytes less usage_in_bytes too) cannot
// hold. tmpfs pages are memory charged to the cgroup, so a segment beyond
// any of these would get the job OOM-killed, or a SIGBUS, instead of an
// error. Limits that cannot be read are not applied.
func CheckSpace(size int64) error {
	for _, r := range rooms() {
		if size > r.bytes {
			return fmt.Errorf("%w: %d bytes (%s) wanted, but %s leaves %d bytes (%s)",
				ErrNoSpace, size, human(size), r.what, r.bytes, human(r.bytes))
		}
	}
	return nil
}

func rooms() []room {
	var rs []room
	var fs unix.Statfs_t
	if unix.Statfs(Dir, &fs) == nil {
		rs = append(rs, room{"the free space of " + Dir, int64(fs.Bavail) * fs.Bsize})
	}
	if avail, ok := memAvailable(); ok {
		rs = append(rs, room{"the memory available (MemAvailable in /proc/meminfo)", avail})
	}
	rs = append(rs, cgroupRooms()...)
	return rs
}

func memAvailable() (int64, bool) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "MemAvailable:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err == nil
		}
	}
	return 0, false
}

// cgroupRooms reads this process's cgroup from /proc/self/cgroup and the
// room its memory limits leave, walking up to the root: a parent's limit
// binds its children too. A level whose directory is not visible (a
// container sees its own cgroup as the root) is skipped.
func cgroupRooms() []room {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil
	}
	var rs []room
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			rs = append(rs, walkCgroup(cgroupRoot, parts[2], "memory.max", "memory.current")...)
		case hasController(parts[1], "memory"):
			rs = append(rs, walkCgroup(filepath.Join(cgroupRoot, "memory"), parts[2], "memory.limit_in_bytes", "memory.usage_in_bytes")...)
		}
	}
	return rs
}

func hasController(list, c string) bool {
	for _, x := range strings.Split(list, ",") {
		if x == c {
			return true
		}
	}
	return false
}

func walkCgroup(root, path, limitFile, usageFile string) []room {
	var rs []room
	dir := filepath.Join(root, filepath.Clean("/"+path))
	for {
		if limit, ok := readInt(filepath.Join(dir, limitFile)); ok && limit < 1<<62 {
			if used, ok := readInt(filepath.Join(dir, usageFile)); ok {
				rs = append(rs, room{fmt.Sprintf("the cgroup memory limit (%s: %d bytes, %d in use)", filepath.Join(dir, limitFile), limit, used), max(limit-used, 0)})
			}
		}
		if dir == root || len(dir) < len(root) {
			return rs
		}
		dir = filepath.Dir(dir)
	}
}

// readInt reads a cgroup number; "max" (no limit) is not a number.
func readInt(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
	return v, err == nil
}

func human(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
