package machine

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// HugePageSize is the size of a transparent huge page on the machines we
// run on (x86-64 and arm64 with 4 KiB base pages).
const HugePageSize = 2 << 20

// THP is the kernel's transparent huge page mode for anonymous memory
// ("always", "madvise" or "never"; "" where it cannot be read).
func THP() string {
	b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil {
		return ""
	}
	for _, f := range strings.Fields(string(b)) {
		if len(f) > 2 && f[0] == '[' && f[len(f)-1] == ']' {
			return f[1 : len(f)-1]
		}
	}
	return ""
}

// AllocHuge maps size bytes of anonymous private memory, starting on a
// huge page boundary and advised MADV_HUGEPAGE up to the next boundary
// after its end, so that the kernel backs
// it with transparent huge pages as it is first touched where its mode
// is "always" or "madvise" (and it has whole huge pages to give). The
// memory is zeroed and outside Go's heap: free calls munmap, after which
// nothing may touch it.
func AllocHuge(size int) (b []byte, free func() error, err error) {
	if size <= 0 {
		return nil, nil, fmt.Errorf("machine: huge page memory of %d bytes", size)
	}
	// Whole huge pages, advised as one range, so that the last part of
	// b (all of it, if it is smaller than one) is in a huge page too; and
	// one huge page more, to start on a boundary.
	whole := (size + HugePageSize - 1) / HugePageSize * HugePageSize
	m, err := unix.Mmap(-1, 0, whole+HugePageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, nil, fmt.Errorf("machine: mapping %d bytes: %w", size, err)
	}
	at := uintptr(unsafe.Pointer(unsafe.SliceData(m)))
	skip := int((HugePageSize - at%HugePageSize) % HugePageSize)
	b = m[skip : skip+size : skip+size]
	if err := unix.Madvise(m[skip:skip+whole], unix.MADV_HUGEPAGE); err != nil {
		unix.Munmap(m)
		return nil, nil, fmt.Errorf("machine: madvise(MADV_HUGEPAGE) of %d bytes: %w", size, err)
	}
	return b, func() error { return unix.Munmap(m) }, nil
}

// HugeBytes counts the bytes of b that are now backed by transparent huge
// pages (the AnonHugePages of the mappings that hold b, in
// /proc/self/smaps), or -1 where that cannot be read. A mapping that
// reaches beyond b counts whole.
func HugeBytes(b []byte) int64 {
	if len(b) == 0 {
		return 0
	}
	lo := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
	hi := lo + uint64(len(b))
	f, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return -1
	}
	var n int64
	in := false
	sc := bufio.NewScanner(bytes.NewReader(f))
	for sc.Scan() {
		line := sc.Text()
		if start, end, ok := vmaRange(line); ok {
			in = start < hi && end > lo
			continue
		}
		if in && strings.HasPrefix(line, "AnonHugePages:") {
			fs := strings.Fields(line)
			if len(fs) == 3 && fs[2] == "kB" {
				if kb, err := strconv.ParseInt(fs[1], 10, 64); err == nil {
					n += kb << 10
				}
			}
		}
	}
	return n
}

// vmaRange parses the head line of a mapping in /proc/PID/smaps
// ("start-end perms ...").
func vmaRange(line string) (start, end uint64, ok bool) {
	sp := strings.IndexByte(line, ' ')
	if sp < 0 {
		return 0, 0, false
	}
	a, b, found := strings.Cut(line[:sp], "-")
	if !found {
		return 0, 0, false
	}
	s, err1 := strconv.ParseUint(a, 16, 64)
	e, err2 := strconv.ParseUint(b, 16, 64)
	return s, e, err1 == nil && err2 == nil && s < e
}
