package launcher

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// The log directory (--log-dir) is a path the user gives, often in a
// directory that others can write (/tmp), and the names under it are
// predictable (RUN_ID/attempt_N/LOCAL_RANK/stdout.log, where the run id
// across nodes defaults to "p<port>"). Another user of the host could lay
// them out first: a link at a log file's name would have the launcher
// truncate and overwrite the file it points to (any file the launcher's
// user may write), and a directory of theirs would have them read the
// job's output. So the directories the launcher writes logs and error
// files into are made, then checked (secureDir): every directory on the
// path, from the root down, must belong to the launcher's user or to root
// and be writable by no other user unless it is sticky (as /tmp is, where
// others can neither remove nor rename what is ours); a link on the path
// must belong to the launcher's user or to root too, and its target is
// checked the same way, link by link. Nobody but the launcher's user,
// root and the members of a group given write access (a team's
// directory: they are trusted with its logs) can then change what the
// path names, or put a link in it (a log the user sends to /dev/null
// through a link of their own is still written there).

// errInsecureLogDir: a log directory others could change.
var errInsecureLogDir = errors.New("unsafe log directory")

// mkdirSecure makes dir (with mode, as os.MkdirAll) and checks that it,
// and every directory above it, is safe to write the job's files into
// (secureDir); the deepest one already there is checked before anything
// is made.
func mkdirSecure(dir string, mode os.FileMode) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	have := abs
	for {
		if _, err := os.Lstat(have); err == nil || have == "/" {
			break
		}
		have = filepath.Dir(have)
	}
	if err := secureDir(have, 0); err != nil {
		return err
	}
	if err := os.MkdirAll(abs, mode); err != nil {
		return err
	}
	return secureDir(abs, 0)
}

// secureDir checks every directory on path dir (absolute), from the root
// down, and every link on it (see above).
func secureDir(dir string, depth int) error {
	if depth > 8 {
		return fmt.Errorf("%w: %s: links keep changing", errInsecureLogDir, dir)
	}
	cur := "/"
	if err := secureEntry(cur, true); err != nil {
		return err
	}
	for _, c := range strings.Split(strings.TrimPrefix(filepath.Clean(dir), "/"), "/") {
		if c == "" {
			continue
		}
		next := filepath.Join(cur, c)
		fi, err := os.Lstat(next)
		if err != nil {
			return err
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			if err := secureEntry(next, false); err != nil {
				return err
			}
			// One link at a time: each of a chain is checked (another
			// user's could be repointed after the check).
			target, err := os.Readlink(next)
			if err != nil {
				return err
			}
			if !filepath.IsAbs(target) {
				target = filepath.Join(cur, target)
			}
			if err := secureDir(target, depth+1); err != nil {
				return err
			}
			real, err := filepath.EvalSymlinks(target)
			if err != nil {
				return err
			}
			cur = real
			continue
		}
		if err := secureEntry(next, true); err != nil {
			return err
		}
		cur = next
	}
	return nil
}

// secureEntry checks one directory (dir true) or link on the path.
func secureEntry(path string, dir bool) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%w: %s: no owner", errInsecureLogDir, path)
	}
	what := "directory"
	if !dir {
		what = "link"
	}
	if uid := uint32(os.Geteuid()); st.Uid != uid && st.Uid != 0 {
		return fmt.Errorf("%w: the %s %s belongs to uid %d, neither this user (%d) nor root: its owner could have the job's logs written over any file, or read them", errInsecureLogDir, what, path, st.Uid, uid)
	}
	if !dir {
		return nil
	}
	if !fi.IsDir() {
		return fmt.Errorf("%w: %s is not a directory", errInsecureLogDir, path)
	}
	if fi.Mode().Perm()&0o002 != 0 && fi.Mode()&os.ModeSticky == 0 {
		return fmt.Errorf("%w: anyone can write the directory %s (mode %04o, not sticky): another user could have the job's logs written over any file, or read them", errInsecureLogDir, path, fi.Mode().Perm())
	}
	return nil
}
