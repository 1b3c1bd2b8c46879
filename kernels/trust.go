package kernels

import "github.com/slimego/slimego/internal/ownpath"

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
// and link on the way to it must belong to this user or to root, and
// nobody else may be able to change them (ownpath.File). A directory or
// file its group can write is accepted only where that group is this
// process's own (a user private group): a library built under umask 002,
// the default for such a group, is mode 0775, and refusing it would guard
// nothing.
func trustedLib(p string) (string, error) {
	return ownpath.File(p, ownpath.OwnGroup)
}
