package kernels

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// A library is code that runs in this process as soon as it is opened
// (its constructors run in dlopen, before any check of its version or
// symbols). The search (candidates) tries kernels/build folders above the
// executable and the working directory, up to the filesystem's root: from
// a job's directory in /tmp (or a test binary's in /tmp/go-build...) that
// reaches /tmp/kernels/build, which any user of the host can make. So a
// library found there is opened only where nobody but this user and root
// can have put it (trustedLib); one that SLIME_CUDA_LIB names, or that the
// loader finds on its own path, is the user's or the system's choice.

// trustedLib returns the path to open for the library file at p (its
// links resolved), or why it is not to be opened: p and every directory
// above it, and every link on the way, must belong to this user or to
// root; none of those directories may be writable by others unless it is
// sticky (as /tmp: nobody else can rename or remove what is ours in it),
// nor by the group unless sticky or of this process's own group (a user
// private group); the file must be writable by its owner alone, or by
// its group where that is this process's own as well (a library built
// under umask 002, the default for a user private group, is mode 0775:
// refusing it would guard nothing, as that group may replace the file in
// its directory, which is accepted).
func trustedLib(p string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	real, err := trustedPath(abs, 0)
	if err != nil {
		return "", err
	}
	fi, err := os.Stat(real)
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", real)
	}
	if err := trustedEntry(real, fi); err != nil {
		return "", err
	}
	st := fi.Sys().(*syscall.Stat_t)
	if m := fi.Mode().Perm(); m&0o002 != 0 || m&0o020 != 0 && st.Gid != uint32(os.Getegid()) {
		return "", fmt.Errorf("others can change %s (mode %04o)", real, m)
	}
	return real, nil
}

// trustedPath checks the directories and links on the absolute path p,
// from the root down (the last element itself only if it is a link), and
// returns p with its links resolved.
func trustedPath(p string, depth int) (string, error) {
	if depth > 8 {
		return "", fmt.Errorf("%s: too many links", p)
	}
	cur := "/"
	parts := strings.Split(strings.TrimPrefix(filepath.Clean(p), "/"), "/")
	for i, c := range parts {
		if err := trustedDir(cur); err != nil {
			return "", err
		}
		if c == "" {
			continue
		}
		next := filepath.Join(cur, c)
		fi, err := os.Lstat(next)
		if err != nil {
			return "", err
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			if err := trustedEntry(next, fi); err != nil {
				return "", err
			}
			target, err := os.Readlink(next)
			if err != nil {
				return "", err
			}
			if !filepath.IsAbs(target) {
				target = filepath.Join(cur, target)
			}
			rest := filepath.Join(append([]string{target}, parts[i+1:]...)...)
			return trustedPath(rest, depth+1)
		}
		cur = next
	}
	return cur, nil
}

// trustedDir checks one directory on the path.
func trustedDir(d string) error {
	fi, err := os.Lstat(d)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", d)
	}
	if err := trustedEntry(d, fi); err != nil {
		return err
	}
	if fi.Mode()&os.ModeSticky != 0 {
		return nil
	}
	st := fi.Sys().(*syscall.Stat_t)
	if m := fi.Mode().Perm(); m&0o002 != 0 || m&0o020 != 0 && st.Gid != uint32(os.Getegid()) {
		return fmt.Errorf("others can write the directory %s (mode %04o)", d, m)
	}
	return nil
}

// trustedEntry checks that fi (of path) belongs to this user or root.
func trustedEntry(path string, fi os.FileInfo) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s: no owner", path)
	}
	if uid := uint32(os.Geteuid()); st.Uid != uid && st.Uid != 0 {
		return fmt.Errorf("%s belongs to uid %d, neither this user (%d) nor root", path, st.Uid, uid)
	}
	return nil
}
