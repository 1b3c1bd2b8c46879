// Package shm maps POSIX shared-memory segments (files under /dev/shm) so
// that ranks on one node can address each other's memory.
//
// Names that come from elsewhere (a rendezvous store) are not trusted:
// Open refuses anything but a plain file name in Dir, does not follow links,
// and checks the file's type, owner, size and header before it maps the
// whole file. Create refuses a size that /dev/shm, the node's memory or the
// cgroup's memory limit cannot hold, before anything is allocated. Names
// made by NewName carry their creator's pid and start time, so that
// SweepOrphans can remove what a killed job left.
//
// Every Segment holds a shared flock on its file from Create or Open until
// Close. A sweep (SweepOrphans, RemovePrefix) removes a file only if it can
// take the exclusive lock without waiting: a segment that some process
// still holds is never removed, whatever its name says, even by a sweeper
// in another pid namespace that shares /dev/shm (where pids mean nothing).
// The kernel drops the lock when the holder dies, so a killed job's
// segments become removable at once.
package shm

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Dir is where POSIX shared memory lives on Linux.
const Dir = "/dev/shm"

// Prefix starts the name of every segment slimego creates (see JobPrefix);
// SweepOrphans looks only at names that start with it.
const Prefix = "slimego-"

// MaxName is the longest segment name (NAME_MAX).
const MaxName = 255

var (
	// ErrNoSpace: a segment is larger than /dev/shm's free space, the
	// memory available, or the cgroup's memory limit allows.
	ErrNoSpace = errors.New("shm: not enough shared memory")
	// ErrBadName: a segment name is not a plain name of this group's.
	ErrBadName = errors.New("shm: unacceptable segment name")
	// ErrForeign: the file under the name is not a segment this caller
	// expects (a link, not a regular file, another user's, another
	// header).
	ErrForeign = errors.New("shm: not the expected segment")
	// ErrWrongSize: the file has another size than the caller expects.
	ErrWrongSize = errors.New("shm: segment has the wrong size")
)

// Segment is one mapping of a shared-memory file.
type Segment struct {
	Name string // file name under Dir
	// Mem is the mapped memory, less the first bytes that Skip hid.
	Mem   []byte
	whole []byte // the whole mapping, for Close
	fd    int    // holds the shared flock until Close; -1 once closed
}

// CheckName says whether name is acceptable as the name of a segment that
// starts with prefix: it must start with prefix, be at most MaxName bytes,
// and hold only ASCII letters, digits, '.', '_' and '-', with no "..". So it
// is one plain file name inside Dir, never a path.
func CheckName(name, prefix string) error {
	switch {
	case prefix == "" || !strings.HasPrefix(name, prefix):
		return fmt.Errorf("%w: %q does not start with %q", ErrBadName, name, prefix)
	case len(name) > MaxName:
		return fmt.Errorf("%w: %q is %d bytes, longer than %d", ErrBadName, name[:32]+"...", len(name), MaxName)
	case strings.Contains(name, ".."):
		return fmt.Errorf("%w: %q holds \"..\"", ErrBadName, name)
	}
	for i := 0; i < len(name); i++ {
		if !nameByte(name[i]) {
			return fmt.Errorf("%w: %q holds the byte %#02x", ErrBadName, name, name[i])
		}
	}
	return nil
}

func nameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
}

// NewName returns prefix, this process's owner tag and a random nonce:
// prefix + "o<pid>.<start time>-" + 12 hex digits. SweepOrphans reads the
// tag back to tell whether the creator still runs.
func NewName(prefix string) (string, error) {
	tag, err := ownerTag()
	if err != nil {
		return "", err
	}
	var nonce [6]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return "", fmt.Errorf("shm: nonce: %w", err)
	}
	name := prefix + tag + "-" + hex.EncodeToString(nonce[:])
	if err := CheckName(name, prefix); err != nil {
		return "", err
	}
	return name, nil
}

// Create makes a new segment of size bytes (failing if the name exists) and
// maps it, faulting every page in now so that the hot path never pays for a
// first touch. A size that the free space of Dir, the memory available or
// the cgroup's limit cannot hold is ErrNoSpace, before any file exists.
func Create(name string, size int) (*Segment, error) {
	if err := plainName(name); err != nil {
		return nil, err
	}
	if size <= 0 {
		return nil, fmt.Errorf("shm: create %s of %d bytes: %w", name, size, unix.EINVAL)
	}
	if err := CheckSpace(int64(size)); err != nil {
		return nil, fmt.Errorf("%w; segment %s not created", err, name)
	}
	path := filepath.Join(Dir, name)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("shm: create %s: %w", path, err)
	}
	fail := func(err error) (*Segment, error) {
		unix.Unlink(path)
		unix.Close(fd)
		return nil, err
	}
	// Lock before the file has a size: from here on no sweep removes it.
	// A sweeper that opened the new (empty) file first holds the exclusive
	// lock for a moment and may unlink it; the creator then sees the lock
	// refused, or the file unlinked, and fails instead of publishing a
	// name that nobody can open.
	if err := unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB); err != nil {
		return fail(fmt.Errorf("shm: lock %s: %w (a sweep is looking at it)", path, err))
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fail(fmt.Errorf("shm: stat %s: %w", path, err))
	}
	if st.Nlink == 0 {
		return fail(fmt.Errorf("shm: create %s: %w (a sweep removed it as it was made)", path, unix.ENOENT))
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return fail(fmt.Errorf("shm: size %s to %d bytes: %w", path, size, err))
	}
	// Allocate the pages now: tmpfs reports a full /dev/shm here as an
	// error instead of a SIGBUS on first touch later.
	if err := unix.Fallocate(fd, 0, 0, int64(size)); err != nil {
		return fail(fmt.Errorf("shm: allocate %d bytes in %s: %w", size, path, err))
	}
	mem, err := mapFD(fd, size)
	if err != nil {
		return fail(fmt.Errorf("shm: map %s: %w", path, err))
	}
	return &Segment{Name: name, Mem: mem, whole: mem, fd: fd}, nil
}

// Open maps an existing segment, which must be a regular file (not a link:
// O_NOFOLLOW) owned by this user, of exactly size bytes. check is given the
// first page (or the whole file, if smaller), mapped read-only, before
// anything else is mapped; its error refuses the segment. A name that is
// not one plain file name in Dir is ErrBadName, a file of another kind or
// owner ErrForeign, another size ErrWrongSize. The segment holds a shared
// lock on the file until Close, so that no sweep removes it meanwhile.
func Open(name string, size int, check func(head []byte) error) (*Segment, error) {
	if err := plainName(name); err != nil {
		return nil, err
	}
	if size <= 0 {
		return nil, fmt.Errorf("shm: open %s of %d bytes: %w", name, size, unix.EINVAL)
	}
	path := filepath.Join(Dir, name)
	// O_NONBLOCK: a FIFO planted under the name must not block the open.
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		if err == unix.ELOOP {
			return nil, fmt.Errorf("%w: %s is a symbolic link", ErrForeign, path)
		}
		return nil, fmt.Errorf("shm: open %s: %w", path, err)
	}
	keep := false
	defer func() {
		if !keep {
			unix.Close(fd)
		}
	}()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("shm: stat %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("%w: %s is not a regular file (mode %#o)", ErrForeign, path, st.Mode)
	}
	if uid := uint32(os.Geteuid()); st.Uid != uid {
		return nil, fmt.Errorf("%w: %s belongs to uid %d, not %d", ErrForeign, path, st.Uid, uid)
	}
	if st.Size != int64(size) {
		return nil, fmt.Errorf("%w: %s holds %d bytes, want %d", ErrWrongSize, path, st.Size, size)
	}
	if check != nil {
		head, err := unix.Mmap(fd, 0, min(size, os.Getpagesize()), unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			return nil, fmt.Errorf("shm: map the header of %s: %w", path, err)
		}
		err = check(head)
		unix.Munmap(head)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrForeign, path, err)
		}
	}
	// Shared, and without waiting: only a sweep takes the exclusive lock,
	// and it holds it only while it decides to remove the file.
	if err := unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB); err != nil {
		return nil, fmt.Errorf("shm: lock %s: %w (a sweep is removing it)", path, err)
	}
	mem, err := mapFD(fd, size)
	if err != nil {
		return nil, fmt.Errorf("shm: map %s: %w", path, err)
	}
	keep = true
	return &Segment{Name: name, Mem: mem, whole: mem, fd: fd}, nil
}

// plainName refuses what is not one file name inside Dir.
func plainName(name string) error {
	if name == "" || len(name) > MaxName || name == "." || name == ".." ||
		strings.ContainsAny(name, "/\x00") {
		return fmt.Errorf("%w: %q is not a file name in %s", ErrBadName, name, Dir)
	}
	return nil
}

func mapFD(fd, size int) ([]byte, error) {
	if size == 0 {
		return nil, fmt.Errorf("empty segment")
	}
	return unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
}

// FD is the descriptor of the segment's file (-1 once closed). It stays
// the segment's: the caller neither closes it nor keeps it past Close.
// A process that maps the file itself (p2p.MapShared) duplicates it.
func (s *Segment) FD() int {
	if s == nil {
		return -1
	}
	return s.fd
}

// Skip hides the first n bytes of the mapping (a header) from Mem; Close
// still unmaps the whole.
func (s *Segment) Skip(n int) {
	s.Mem = s.Mem[n:len(s.Mem):len(s.Mem)]
}

// Close unmaps the segment and releases its lock (a sweep may then remove
// the file if its creator is gone). The file itself is removed by Unlink.
func (s *Segment) Close() error {
	if s == nil || s.whole == nil {
		return nil
	}
	err := unix.Munmap(s.whole)
	if s.fd >= 0 {
		if e := unix.Close(s.fd); err == nil {
			err = e
		}
	}
	s.Mem, s.whole, s.fd = nil, nil, -1
	return err
}

// Unlink removes the segment's name; mappings stay valid until unmapped.
// A name already gone is not an error.
func Unlink(name string) error {
	if err := plainName(name); err != nil {
		return err
	}
	err := unix.Unlink(filepath.Join(Dir, name))
	if err == unix.ENOENT {
		return nil
	}
	return err
}

// RemovePrefix unlinks every segment of this user's whose name starts
// with prefix and that no process holds (see removeUnheld), and returns
// the names it removed: the launcher's sweep after a job. A segment still
// held is kept: it belongs to a live job whose run id starts with this
// one's (job "abc"'s prefix "slimego-abc-" also starts job "abc-def"'s
// names); so is another user's, held or not (a launcher run as root).
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
			if removeUnheld(e.Name(), nil) {
				removed = append(removed, e.Name())
			}
		}
	}
	return removed, nil
}

// JobPrefix starts the name of every segment of the run with this id, so
// that a launcher can remove what a killed job left (RemovePrefix).
func JobPrefix(runID string) string { return Prefix + runID + "-" }

// removeUnheld unlinks Dir/name if no process holds a lock on it and gone
// (when not nil) says its creator no longer runs; it reports whether it
// removed the name. It opens the file without following links and without
// blocking (a FIFO), and decides under the exclusive lock, taken without
// waiting: a Segment's holder keeps a shared lock from Create or Open
// until Close, so a held segment is refused, in any pid namespace. What it
// cannot open as a regular file (a link, a FIFO) it unlinks without a lock
// when gone is nil, as RemovePrefix always did, and leaves otherwise; but
// only where it is this user's: another user's name (which only root may
// unlink in the sticky /dev/shm) is that user's job's, live or not, and
// left to that user's sweeps.
func removeUnheld(name string, gone func() bool) bool {
	path := filepath.Join(Dir, name)
	uid := uint32(os.Geteuid())
	mine := func() bool {
		var st unix.Stat_t
		return unix.Lstat(path, &st) == nil && st.Uid == uid
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return gone == nil && err != unix.ENOENT && mine() && Unlink(name) == nil
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Uid != uid {
		return false
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return gone == nil && Unlink(name) == nil
	}
	if unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) != nil {
		return false // held: a live segment
	}
	if gone != nil && !gone() {
		return false
	}
	// Still the file this fd has open? (A name is never reused in
	// practice: it holds a random nonce.)
	var now unix.Stat_t
	if unix.Lstat(path, &now) != nil || now.Ino != st.Ino || now.Dev != st.Dev {
		return false
	}
	return unix.Unlink(path) == nil
}
