package auth

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
)

// ErrSecretFile: a job secret file that cannot be used.
var ErrSecretFile = errors.New("auth: job secret file")

// maxSecretFile bounds what is read of a secret file.
const maxSecretFile = 64 << 10

// ReadSecretFile reads a job secret: the first line of path, trimmed, which
// must not be empty. The file must be a regular file of this user's (or
// root's) that neither its group nor others can read or change (as ssh
// demands of a key): anyone who can read it can join the job. Only its first 64 KiB are read, and opening it
// never blocks (a FIFO is refused, not waited on).
func ReadSecretFile(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSecretFile, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSecretFile, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s is not a regular file", ErrSecretFile, path)
	}
	// Its owner reads it whatever its mode: another user's file is
	// refused (root's, which only root reads, is not).
	if sys, ok := st.Sys().(*syscall.Stat_t); !ok {
		return nil, fmt.Errorf("%w: %s: no owner", ErrSecretFile, path)
	} else if uid := uint32(os.Geteuid()); sys.Uid != uid && sys.Uid != 0 {
		return nil, fmt.Errorf("%w: %s belongs to uid %d, not to this user (%d): its owner can read it, so could join the job (or chose its secret)", ErrSecretFile, path, sys.Uid, uid)
	}
	if m := st.Mode().Perm(); m&0o077 != 0 {
		return nil, fmt.Errorf("%w: %s has mode %04o: its group or others can read or change it, so anyone among them could join the job; chmod 600 %s", ErrSecretFile, path, m, path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFile))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrSecretFile, path, err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	line = strings.TrimSpace(line)
	if line == "" {
		return nil, fmt.Errorf("%w: %s holds no secret on its first line", ErrSecretFile, path)
	}
	return []byte(line), nil
}
