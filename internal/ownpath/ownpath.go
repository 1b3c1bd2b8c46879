// Package ownpath checks that nobody but this process's user and root can
// change what a path names, before the process writes to it or runs code
// from it.
//
// A path is only as safe as every directory and link on the way to it:
// another user who can write a directory above a file can rename the
// file away and put their own (or a link to any file) in its place, and
// the owner of a link can repoint it. So the check walks the path from
// the root down, one element at a time, and follows each link on it by
// checking the link's target the same way (each link of a chain, as a
// link's owner may repoint it after the check):
//   - every directory must belong to this user or to root, and must be
//     writable by no other user unless it is sticky (as /tmp is: nobody
//     else can remove or rename what is ours in it); a directory its
//     group can write is accepted as the caller's Group rule says;
//   - every link must belong to this user or to root.
//
// Dir checks a directory the caller will write into; File checks a file
// the caller will open and trust (a library to load), itself included.
// Both return the path with its links resolved, so that the caller opens
// what was checked. They cannot stop this user or root from changing the
// path afterwards, and need not: those can change the process anyway.
package ownpath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// ErrUnsafe: someone other than this user and root could change what the
// path names. Errors for a path that is missing or unreadable are the
// file system's own.
var ErrUnsafe = errors.New("ownpath: others could change the path")

// Group says whom a directory (or file) writable by its group is trusted
// to.
type Group int

const (
	// OwnGroup accepts a group-writable entry only where its group is this
	// process's effective group: a user private group under umask 002
	// (the default where every user has a group of their own), whose
	// members are the user alone.
	OwnGroup Group = iota
	// AnyGroup accepts any group-writable entry: the members of its group
	// are trusted with what is under it (a team's directory).
	AnyGroup
)

// maxLinks bounds the links followed on one path, as the kernel's
// (MAXSYMLINKS): more is a loop (ELOOP).
const maxLinks = 40

// Dir checks the directory dir and every directory and link on the way to
// it (see the package doc), and returns dir absolute with its links
// resolved.
func Dir(dir string, g Group) (string, error) {
	real, err := resolve(dir, g)
	if err != nil {
		return "", err
	}
	fi, err := os.Lstat(real)
	if err != nil {
		return "", err
	}
	if err := checkDir(real, fi, g); err != nil {
		return "", err
	}
	return real, nil
}

// File checks the regular file p, and every directory and link on the way
// to it (see the package doc): the file must belong to this user or to
// root and be writable by nobody else (by its group only as g allows). It
// returns p absolute with its links resolved.
func File(p string, g Group) (string, error) {
	real, err := resolve(p, g)
	if err != nil {
		return "", err
	}
	fi, err := os.Lstat(real)
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%w: %s is not a regular file", ErrUnsafe, real)
	}
	if err := checkOwner("file", real, fi); err != nil {
		return "", err
	}
	if err := checkMode("file", real, fi, g); err != nil {
		return "", err
	}
	return real, nil
}

// resolve checks the directories above p's last element and the links on
// the way (p's last element too, where it is a link), from the root down,
// and returns p absolute with its links resolved. It does not check the
// last element itself, unless a link. A link's target is followed as the
// kernel follows it, one element at a time: its ".." is the parent of
// where the link led (the text "link/.." is not cleaned away).
func resolve(p string, g Group) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	todo := strings.Split(abs, "/")
	cur := "/" // never holds a link
	links := 0
	for len(todo) > 0 {
		c := todo[0]
		todo = todo[1:]
		fi, err := os.Lstat(cur)
		if err != nil {
			return "", err
		}
		if err := checkDir(cur, fi, g); err != nil {
			return "", err
		}
		switch c {
		case "", ".":
			continue
		case "..":
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, c)
		fi, err = os.Lstat(next)
		if err != nil {
			return "", err
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			cur = next
			continue
		}
		if links++; links > maxLinks {
			return "", fmt.Errorf("%s: %w (more than %d links)", p, syscall.ELOOP, maxLinks)
		}
		if err := checkOwner("link", next, fi); err != nil {
			return "", err
		}
		target, err := os.Readlink(next)
		if err != nil {
			return "", err
		}
		if filepath.IsAbs(target) {
			cur = "/"
		}
		todo = append(strings.Split(target, "/"), todo...)
	}
	return cur, nil
}

// checkDir checks one directory on the path.
func checkDir(d string, fi os.FileInfo, g Group) error {
	if !fi.IsDir() {
		return fmt.Errorf("%w: %s is not a directory", ErrUnsafe, d)
	}
	if err := checkOwner("directory", d, fi); err != nil {
		return err
	}
	if fi.Mode()&os.ModeSticky != 0 {
		return nil
	}
	return checkMode("directory", d, fi, g)
}

// checkOwner checks that fi (of the entry what at path) belongs to this
// user or to root.
func checkOwner(what, path string, fi os.FileInfo) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%w: the %s %s has no owner", ErrUnsafe, what, path)
	}
	if uid := uint32(os.Geteuid()); st.Uid != uid && st.Uid != 0 {
		return fmt.Errorf("%w: the %s %s belongs to uid %d, neither this user (%d) nor root", ErrUnsafe, what, path, st.Uid, uid)
	}
	return nil
}

// checkMode checks that nobody but the owner (and the group, as g allows)
// can write fi (of the entry what at path).
func checkMode(what, path string, fi os.FileInfo, g Group) error {
	m := fi.Mode().Perm()
	if m&0o002 != 0 {
		return fmt.Errorf("%w: anyone can write the %s %s (mode %04o)", ErrUnsafe, what, path, m)
	}
	if m&0o020 == 0 || g == AnyGroup {
		return nil
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || st.Gid != uint32(os.Getegid()) {
		gid := -1
		if ok {
			gid = int(st.Gid)
		}
		return fmt.Errorf("%w: group %d, not this process's own (%d), can write the %s %s (mode %04o)", ErrUnsafe, gid, os.Getegid(), what, path, m)
	}
	return nil
}
