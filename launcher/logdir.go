package launcher

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/slimego/slimego/internal/ownpath"
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
	if err := secureDir(have); err != nil {
		return err
	}
	if err := os.MkdirAll(abs, mode); err != nil {
		return err
	}
	return secureDir(abs)
}

// secureDir checks every directory and link on the path dir, from the
// root down (see above; ownpath.Dir, whose members of a group with write
// access are trusted).
func secureDir(dir string) error {
	_, err := ownpath.Dir(dir, ownpath.AnyGroup)
	if errors.Is(err, ownpath.ErrUnsafe) {
		return fmt.Errorf("%w: %w: its owner, or whoever can write it, could have the job's logs written over any file, or read them", errInsecureLogDir, err)
	}
	return err
}
