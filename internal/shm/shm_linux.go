// Package shm maps POSIX shared-memory segments (files under /dev/shm) so
// that ranks on one node can address each other's memory.
package shm

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Dir is where POSIX shared memory lives on Linux.
const Dir = "/dev/shm"

// Segment is one mapping of a shared-memory file.
type Segment struct {
	Name string // file name under Dir
	Mem  []byte
}

// Create makes a new segment of size bytes (failing if the name exists) and
// maps it, faulting every page in now so that the hot path never pays for a
// first touch.
func Create(name string, size int) (*Segment, error) {
	path := filepath.Join(Dir, name)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("shm: create %s: %w", path, err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Unlink(path)
		return nil, fmt.Errorf("shm: size %s to %d bytes: %w", path, size, err)
	}
	// Allocate the pages now: tmpfs reports a full /dev/shm here as an
	// error instead of a SIGBUS on first touch later.
	if err := unix.Fallocate(fd, 0, 0, int64(size)); err != nil {
		unix.Unlink(path)
		return nil, fmt.Errorf("shm: allocate %d bytes in %s: %w", size, path, err)
	}
	mem, err := mapFD(fd, size)
	if err != nil {
		unix.Unlink(path)
		return nil, fmt.Errorf("shm: map %s: %w", path, err)
	}
	return &Segment{Name: name, Mem: mem}, nil
}

// Open maps an existing segment in full.
func Open(name string) (*Segment, error) {
	path := filepath.Join(Dir, name)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("shm: open %s: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("shm: stat %s: %w", path, err)
	}
	mem, err := mapFD(fd, int(st.Size))
	if err != nil {
		return nil, fmt.Errorf("shm: map %s: %w", path, err)
	}
	return &Segment{Name: name, Mem: mem}, nil
}

func mapFD(fd, size int) ([]byte, error) {
	if size == 0 {
		return nil, fmt.Errorf("empty segment")
	}
	return unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
}

// Close unmaps the segment. The file itself is removed by Unlink.
func (s *Segment) Close() error {
	if s == nil || s.Mem == nil {
		return nil
	}
	err := unix.Munmap(s.Mem)
	s.Mem = nil
	return err
}

// Unlink removes the segment's name; mappings stay valid until unmapped.
// A name already gone is not an error.
func Unlink(name string) error {
	err := unix.Unlink(filepath.Join(Dir, name))
	if err == unix.ENOENT {
		return nil
	}
	return err
}

// RemovePrefix unlinks every segment whose name starts with prefix and
// returns the names it removed: the launcher's sweep after a job.
func RemovePrefix(prefix string) ([]string, error) {
	if prefix == "" || strings.ContainsRune(prefix, '/') {
		return nil, fmt.Errorf("shm: refusing to sweep prefix %q", prefix)
	}
	entries, err := os.ReadDir(Dir)
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			if Unlink(e.Name()) == nil {
				removed = append(removed, e.Name())
			}
		}
	}
	return removed, nil
}

// JobPrefix starts the name of every segment of the run with this id, so
// that a launcher can remove what a killed job left (RemovePrefix).
func JobPrefix(runID string) string { return "slimego-" + runID + "-" }
