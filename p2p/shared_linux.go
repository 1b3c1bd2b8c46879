package p2p

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Shared is host memory that peers on the same host copy to and from
// themselves, through a mapping of their own (zero copy: one memcpy by
// the initiator, no kernel copy, no socket), where process_vm_readv and
// process_vm_writev copy a plain slice's bytes through the kernel. It is
// an anonymous memory file (memfd) sealed at its size, so that a peer that
// maps it can neither be made to fault by its shrinking nor leave
// anything behind in /dev/shm (NewShared); or a part of a file in
// /dev/shm, such as the symmetric memory of a collective.Buffer
// (MapShared). A peer on another host reads and writes it over TCP, as
// any other region.
//
// Register it like any memory (Endpoint.Register); Close it once every
// region on it is deregistered (or its endpoint closed).
type Shared struct {
	fd    int
	n     int
	b     []byte
	whole []byte // the mapping (b, and before it the rest of its first page)
	base  uint64 // where b starts in the file
	id    uint64 // names the memory in grants (random, never 0)

	mu      sync.Mutex
	closed  bool
	regions map[*Region]struct{}
}

// NewShared allocates size bytes of zeroed shared memory.
func NewShared(size int) (*Shared, error) {
	if size <= 0 || uint64(size) > MaxLen {
		return nil, opErr("shared", "", "", ErrInvalid, "%d bytes", size)
	}
	fd, err := unix.MemfdCreate("slimego-p2p", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, opErr("shared", "", "", ErrInvalid, "memfd_create: %v", err)
	}
	fail := func(what string, err error) (*Shared, error) {
		unix.Close(fd)
		return nil, opErr("shared", "", "", ErrInvalid, "%s of %d bytes: %v", what, size, err)
	}
	// Allocated now, so that a full memory shows here and not as a fault
	// on a later access (a file system without fallocate gets a sized,
	// sparse file).
	if err := unix.Fallocate(fd, 0, 0, int64(size)); errors.Is(err, unix.EOPNOTSUPP) {
		if err := unix.Ftruncate(fd, int64(size)); err != nil {
			return fail("ftruncate", err)
		}
	} else if err != nil {
		return fail("fallocate", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return fail("sealing", err)
	}
	b, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail("mmap", err)
	}
	return &Shared{fd: fd, n: size, b: b, whole: b, id: randomID(), regions: map[*Region]struct{}{}}, nil
}

// randomID is a random memory id (never 0).
func randomID() uint64 {
	var k [8]byte
	for binary.LittleEndian.Uint64(k[:]) == 0 {
		rand.Read(k[:])
	}
	return binary.LittleEndian.Uint64(k[:])
}

// MapShared makes Shared memory of the n bytes at off in the file fd: a
// regular file on tmpfs, such as the file in /dev/shm that holds a
// collective.Buffer (its File method gives fd and off) or a memory file
// (memfd). It maps them itself, through a descriptor of its own, so the
// memory stays valid until Close even if the caller closes fd or unmaps
// its own mapping (frees the Buffer) first; the bytes are the same pages
// as the caller's mapping of the file, so what either writes the other
// sees.
//
// A peer on this host copies to and from it through a mapping of its
// own (zero copy, transport "shm") where the file is a memory file
// sealed against shrinking (NewShared's), or a file on the file system
// at the peer's own /dev/shm (a peer in another mount namespace that
// shares it, as `ip netns exec` or a container given the host's /dev/shm,
// qualifies; one with a /dev/shm of its own copies with process_vm,
// "cma"). A file in /dev/shm cannot be sealed:
// whoever shrinks it makes the peers' copies through their mappings fail
// with a fault, not their processes, but this process touches the
// region's pages itself (serving small transfers over TCP) and, as with
// any mapped file, faults (SIGBUS) on a page past the file's end: do not
// shrink a file while it is registered.
func MapShared(fd int, off int64, n int) (*Shared, error) {
	if fd < 0 || off < 0 || n <= 0 || uint64(n) > MaxLen || uint64(off) > MaxLen {
		return nil, opErr("shared", "", "", ErrInvalid, "%d bytes at %d of file %d", n, off, fd)
	}
	f, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, opErr("shared", "", "", ErrInvalid, "file %d: %v", fd, err)
	}
	fail := func(format string, args ...any) (*Shared, error) {
		unix.Close(f)
		return nil, opErr("shared", "", "", ErrInvalid, "file %d: "+format, append([]any{fd}, args...)...)
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(f, &fs); err != nil || fs.Type != unix.TMPFS_MAGIC {
		return fail("not on tmpfs (type %#x, %v)", fs.Type, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(f, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fail("not a regular file (mode %#o, %v)", st.Mode, err)
	}
	if off+int64(n) > st.Size {
		return fail("%d bytes at %d of a file of %d", n, off, st.Size)
	}
	page := int64(os.Getpagesize())
	lo := off &^ (page - 1)
	whole, err := unix.Mmap(f, lo, int(off-lo)+n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail("mmap: %v", err)
	}
	b := whole[off-lo : off-lo+int64(n) : off-lo+int64(n)]
	return &Shared{fd: f, n: n, b: b, whole: whole, base: uint64(off), id: randomID(), regions: map[*Region]struct{}{}}, nil
}

// Bytes is the memory (nil once closed).
func (s *Shared) Bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	return s.b
}

// Len is the memory's size in bytes.
func (s *Shared) Len() int { return s.n }

// Close unmaps the memory and frees it (once no peer maps it either). It
// fails with ErrInvalid while a region on it is registered: deregister
// them first (or close their endpoints).
func (s *Shared) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	for r := range s.regions {
		if !r.idle() {
			return opErr("shared", "", r.label(), ErrInvalid, "the memory is still registered")
		}
	}
	s.closed = true
	err := unix.Munmap(s.whole)
	unix.Close(s.fd)
	s.b, s.whole = nil, nil
	return err
}

// attach records r as a region on s (Register), unless s is closed.
func (s *Shared) attach(r *Region) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return opErr("register", "", r.label(), ErrInvalid, "the shared memory is closed")
	}
	for old := range s.regions { // forget the deregistered ones
		if old.idle() {
			delete(s.regions, old)
		}
	}
	s.regions[r] = struct{}{}
	return nil
}

// detach forgets r (a registration that failed).
func (s *Shared) detach(r *Region) {
	s.mu.Lock()
	delete(s.regions, r)
	s.mu.Unlock()
}

// offset is where b, a piece of s's memory, starts in its file.
func (s *Shared) offset(b []byte) uint64 {
	return s.base + uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))-uintptr(unsafe.Pointer(unsafe.SliceData(s.b))))
}

// maxMaps bounds the peers' memories a link keeps mapped; past it, the
// least recently used one that no copy uses is unmapped, and where every
// one is in use the grant is copied by process_vm instead. Across the
// endpoint's links at most maxEndpointMaps mappings of at most
// maxMappedBytes together are made, so that peers (hostile ones among
// them) cannot use up the process's address space or its mappings.
const (
	maxMaps         = 64
	maxEndpointMaps = 1024
	maxMappedBytes  = 16 << 40
)

// peerMap is a mapping of a peer's Shared memory, made by the initiator
// of a transfer to copy through; the link keeps it for later transfers.
type peerMap struct {
	b    []byte
	refs int    // copies using it now
	used uint64 // the link's mapTick when last taken
	// A file in /dev/shm (MapShared's) rather than a memory file: it is
	// unmapped as soon as nothing uses it (dropUnused), since it holds
	// every rank's part of a symmetric buffer and its space in /dev/shm
	// stays taken while it is mapped, even after its owners free it.
	id   uint64
	file bool
}

// mapPeer returns a mapping of the peer's Shared memory id (the file at
// fd in its process) of at least need bytes, taking a reference that
// unmapPeer drops. Nothing in the grant is taken on trust: the file must
// be a regular file on tmpfs, not hugetlbfs, at least need bytes long,
// and either a memory file (memfd) sealed against shrinking (so that no
// access to the mapping can fault) or a file on the tmpfs at this
// process's /dev/shm (which cannot be sealed: a fault, should its owner
// shrink it, fails the copy, see shmChunk): its mount, in the peer's
// namespace, must be a tmpfs of /dev/shm's device number (sameShm). The
// descriptor is looked at before it is taken, so that no other kind of
// file (one a peer serves through FUSE, say) is ever held here, and the
// taken one must be on the mount looked at.
func (l *link) mapPeer(id uint64, fd uint32, need uint64) (*peerMap, error) {
	l.mu.Lock()
	if m := l.maps[id]; m != nil {
		if uint64(len(m.b)) < need {
			l.mu.Unlock()
			return nil, fmt.Errorf("a grant of %d bytes of memory %#x, which has %d", need, id, len(m.b))
		}
		m.refs++
		l.mapTick++
		m.used = l.mapTick
		l.mu.Unlock()
		return m, nil
	}
	l.mu.Unlock()
	proc := "self"
	if !l.self {
		proc = strconv.Itoa(l.pid)
	}
	name, err := os.Readlink("/proc/" + proc + "/fd/" + strconv.FormatUint(uint64(fd), 10))
	memfd := err == nil && strings.HasPrefix(name, "/memfd:")
	mnt := -1
	if !memfd {
		if mnt = fdMount(proc, fd); err != nil || mnt < 0 || !sameShm(proc, mnt) {
			return nil, fmt.Errorf("the peer's file %d is neither a memory file nor on this process's /dev/shm (%q, %v)", fd, name, err)
		}
	}
	var f int
	switch {
	case l.pidfd >= 0:
		f, err = unix.PidfdGetfd(l.pidfd, int(fd), 0)
	case l.self: // the peer is this process
		f, err = unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	default:
		err = fmt.Errorf("no pidfd on the peer")
	}
	if err != nil {
		return nil, fmt.Errorf("taking the peer's memory file %d: %v", fd, err)
	}
	// The file taken must be the one looked at (the peer may have put
	// another at fd meanwhile): checked first through this process's own
	// /proc, which asks nothing of the file's file system. A file that
	// fails is closed in a goroutine of its own, since a close may wait
	// for its file system (FUSE's flush): the link goes on.
	if name, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(f)); memfd && (err != nil || !strings.HasPrefix(name, "/memfd:")) ||
		!memfd && fdMount("self", uint32(f)) != mnt {
		go unix.Close(f)
		return nil, fmt.Errorf("the peer's file %d changed while it was taken (%q, %v)", fd, name, err)
	}
	defer unix.Close(f)
	var fs unix.Statfs_t
	if err := unix.Fstatfs(f, &fs); err != nil || fs.Type != unix.TMPFS_MAGIC {
		return nil, fmt.Errorf("the peer's file %d is not on tmpfs (type %#x, %v)", fd, fs.Type, err)
	}
	if memfd {
		seals, err := unix.FcntlInt(uintptr(f), unix.F_GET_SEALS, 0)
		if err != nil || seals&unix.F_SEAL_SHRINK == 0 {
			return nil, fmt.Errorf("the peer's file %d is not a memory file sealed at its size (seals %#x, %v)", fd, seals, err)
		}
	}
	var st unix.Stat_t
	if err := unix.Fstat(f, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("the peer's memory file %d: not a regular file (mode %#o, %v)", fd, st.Mode, err)
	}
	if st.Size <= 0 || uint64(st.Size) > MaxLen || uint64(st.Size) < need || uint64(st.Size) > uint64(^uint(0)>>1) {
		return nil, fmt.Errorf("a grant of %d bytes of the peer's memory file %d of %d", need, fd, st.Size)
	}
	size := st.Size
	e := l.e
	if e.mapCount.Add(1) > maxEndpointMaps || e.mapBytes.Add(size) > maxMappedBytes {
		e.mapCount.Add(-1)
		e.mapBytes.Add(-size)
		return nil, fmt.Errorf("the endpoint maps %d memories of peers already", maxEndpointMaps)
	}
	unreserve := func() { e.mapCount.Add(-1); e.mapBytes.Add(-size) }
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		unreserve()
		return nil, l.err
	}
	if m := l.maps[id]; m != nil { // another copy mapped it meanwhile
		unreserve()
		if uint64(len(m.b)) < need {
			return nil, fmt.Errorf("a grant of %d bytes of memory %#x, which has %d", need, id, len(m.b))
		}
		m.refs++
		return m, nil
	}
	if l.maps == nil {
		l.maps = map[uint64]*peerMap{}
	}
	for len(l.maps) >= maxMaps {
		var old uint64
		var oldest *peerMap
		for k, m := range l.maps {
			if m.refs == 0 && (oldest == nil || m.used < oldest.used) {
				old, oldest = k, m
			}
		}
		if oldest == nil { // every one is in use
			unreserve()
			return nil, fmt.Errorf("the link maps %d memories of the peer already, all in use", maxMaps)
		}
		delete(l.maps, old)
		l.unmap(oldest)
	}
	b, err := unix.Mmap(f, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unreserve()
		return nil, fmt.Errorf("mapping the peer's memory file %d: %v", fd, err)
	}
	l.mapTick++
	m := &peerMap{b: b, refs: 1, used: l.mapTick, id: id, file: !memfd}
	l.maps[id] = m
	return m, nil
}

// devShm is the device number of the file system at this process's
// /dev/shm, if it is a tmpfs (ok false otherwise): a peer's file on it
// is one this process could open itself, not one a peer serves (through
// FUSE, say) or a tmpfs of its own; a peer in another mount namespace
// (`ip netns exec`, a container given the same /dev/shm) sees it as a
// mount of its own, of the same file system. The descriptor stays open
// for the process's life, so that the file system is the one at
// /dev/shm when this process first looked.
var devShm = sync.OnceValues(func() (uint64, bool) {
	fd, err := unix.Open("/dev/shm", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, false
	}
	var fs unix.Statfs_t
	var st unix.Stat_t
	if unix.Fstatfs(fd, &fs) != nil || fs.Type != unix.TMPFS_MAGIC || unix.Fstat(fd, &st) != nil {
		unix.Close(fd)
		return 0, false
	}
	return st.Dev, true
})

// sameShm says whether mount mnt of process proc is a tmpfs mount of the
// file system at this process's /dev/shm (devShm), from proc's mountinfo:
// nothing is asked of the file system itself.
func sameShm(proc string, mnt int) bool {
	dev, ok := devShm()
	if !ok {
		return false
	}
	b, err := os.ReadFile("/proc/" + proc + "/mountinfo")
	if err != nil {
		return false
	}
	id := strconv.Itoa(mnt) + " "
	for line := range strings.Lines(string(b)) {
		if !strings.HasPrefix(line, id) {
			continue
		}
		// "id parent major:minor root point options [optional...] - type source super"
		f := strings.Fields(line)
		sep := slices.Index(f, "-")
		if len(f) < 3 || sep < 0 || sep+1 >= len(f) {
			return false
		}
		want := strconv.FormatUint(uint64(unix.Major(dev)), 10) + ":" + strconv.FormatUint(uint64(unix.Minor(dev)), 10)
		return f[2] == want && f[sep+1] == "tmpfs"
	}
	return false
}

// fdMount is the mount id of the file at fd in process proc ("self" or
// a pid), from its fdinfo (-1 where it cannot be read).
func fdMount(proc string, fd uint32) int {
	b, err := os.ReadFile("/proc/" + proc + "/fdinfo/" + strconv.FormatUint(uint64(fd), 10))
	if err != nil {
		return -1
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "mnt_id:"); ok {
			if id, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && id >= 0 {
				return id
			}
		}
	}
	return -1
}

// unmap unmaps m and gives its share of the endpoint's bounds back.
func (l *link) unmap(m *peerMap) {
	unix.Munmap(m.b)
	l.e.mapCount.Add(-1)
	l.e.mapBytes.Add(-int64(len(m.b)))
}

// unmapPeer drops a reference that mapPeer took; a link that has ended
// unmaps what nothing uses any more.
func (l *link) unmapPeer(m *peerMap) {
	l.mu.Lock()
	defer l.mu.Unlock()
	m.refs--
	l.dropUnused(m)
}

// dropUnused unmaps m (under l.mu) if nothing uses it and it is not to be
// kept: the link has ended, or m maps a file in /dev/shm.
func (l *link) dropUnused(m *peerMap) {
	if l.err != nil {
		l.dropMaps()
		return
	}
	if m.refs == 0 && m.file && l.maps[m.id] == m {
		delete(l.maps, m.id)
		l.unmap(m)
	}
}

// dropMaps unmaps the peers' memories that no copy uses (under l.mu).
func (l *link) dropMaps() {
	for k, m := range l.maps {
		if m.refs == 0 {
			delete(l.maps, k)
			l.unmap(m)
		}
	}
}

// shmCopy copies local to (write) or from the peer's mapped remote, of
// the same length, under mu while *active, a chunk at a time (so that a
// cancelled transfer stops touching either side's memory at its next
// chunk). A fault in the mapping (which the checks of mapPeer should rule
// out: a page the peer's memory cannot provide) fails the copy instead of
// the process.
func shmCopy(mu *sync.Mutex, active *bool, local, remote []byte, write bool) error {
	for len(local) > 0 {
		k := min(len(local), cmaChunk)
		if done, err := shmChunk(mu, active, local[:k], remote[:k], write); done || err != nil {
			return err
		}
		local, remote = local[k:], remote[k:]
	}
	return nil
}

// shmChunk is one chunk of shmCopy; done says the part is no longer
// active.
func shmChunk(mu *sync.Mutex, active *bool, local, remote []byte, write bool) (done bool, err error) {
	mu.Lock()
	defer mu.Unlock()
	if !*active {
		return true, nil
	}
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("a fault in the peer's memory: %v", r)
		}
	}()
	if write {
		copy(remote, local)
	} else {
		copy(local, remote)
	}
	return false, nil
}
