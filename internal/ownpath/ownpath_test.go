package ownpath

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// layout is one case's tree under a fresh base directory (mode 0755, of
// this user; t.TempDir's parents are /tmp, sticky, and root's).
type layout struct {
	name  string
	make  func(t *testing.T, base string) string // returns the path to check
	root  bool                                   // needs root (to give entries to another user)
	dir   Group                                  // rule for Dir
	isDir bool                                   // check with Dir, else File
	want  string                                 // "" to accept, else a part of the error
}

// other is the user and group (nobody's) that root gives entries to.
const other = 65534

func mkdir(t *testing.T, p string, mode os.FileMode) string {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

func mkfile(t *testing.T, p string, mode os.FileMode) string {
	t.Helper()
	if err := os.WriteFile(p, []byte("x"), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

func link(t *testing.T, target, p string, uid int) string {
	t.Helper()
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
	if uid >= 0 {
		if err := os.Lchown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

func chown(t *testing.T, p string, uid, gid int) {
	t.Helper()
	if err := os.Lchown(p, uid, gid); err != nil {
		t.Fatal(err)
	}
}

func TestCheck(t *testing.T) {
	cases := []layout{
		{name: "own directory", isDir: true, make: func(t *testing.T, b string) string {
			return mkdir(t, filepath.Join(b, "a", "b"), 0o755)
		}},
		{name: "directory anyone can write", isDir: true, want: "anyone can write the directory", make: func(t *testing.T, b string) string {
			mkdir(t, filepath.Join(b, "a"), 0o777)
			return mkdir(t, filepath.Join(b, "a", "b"), 0o755)
		}},
		{name: "sticky directory anyone can write", isDir: true, make: func(t *testing.T, b string) string {
			mkdir(t, filepath.Join(b, "a"), os.ModeSticky|0o777)
			return mkdir(t, filepath.Join(b, "a", "b"), 0o700)
		}},
		{name: "the directory itself anyone can write", isDir: true, want: "anyone can write the directory", make: func(t *testing.T, b string) string {
			return mkdir(t, filepath.Join(b, "a"), 0o777)
		}},
		{name: "group-writable, own group", isDir: true, dir: OwnGroup, make: func(t *testing.T, b string) string {
			d := mkdir(t, filepath.Join(b, "a"), 0o775)
			chown(t, d, -1, os.Getegid())
			return d
		}},
		{name: "group-writable, another group, own-group rule", root: true, isDir: true, dir: OwnGroup, want: "not this process's own", make: func(t *testing.T, b string) string {
			d := mkdir(t, filepath.Join(b, "a"), 0o775)
			chown(t, d, -1, other)
			return mkdir(t, filepath.Join(d, "b"), 0o755)
		}},
		{name: "group-writable, another group, any-group rule", root: true, isDir: true, dir: AnyGroup, make: func(t *testing.T, b string) string {
			d := mkdir(t, filepath.Join(b, "a"), 0o775)
			chown(t, d, -1, other)
			return mkdir(t, filepath.Join(d, "b"), 0o755)
		}},
		{name: "another user's directory above", root: true, isDir: true, want: "belongs to uid 65534", make: func(t *testing.T, b string) string {
			d := mkdir(t, filepath.Join(b, "a"), 0o755)
			chown(t, d, other, other)
			return mkdir(t, filepath.Join(d, "b"), 0o755)
		}},
		{name: "another user's directory itself", root: true, isDir: true, want: "belongs to uid 65534", make: func(t *testing.T, b string) string {
			d := mkdir(t, filepath.Join(b, "a"), 0o755)
			chown(t, d, other, other)
			return d
		}},
		{name: "own link to own directory", isDir: true, make: func(t *testing.T, b string) string {
			mkdir(t, filepath.Join(b, "real"), 0o755)
			return link(t, "real", filepath.Join(b, "l"), -1)
		}},
		{name: "own link on the way", isDir: true, make: func(t *testing.T, b string) string {
			mkdir(t, filepath.Join(b, "real", "sub"), 0o755)
			link(t, filepath.Join(b, "real"), filepath.Join(b, "l"), -1)
			return filepath.Join(b, "l", "sub")
		}},
		{name: "own link to a directory anyone can write", isDir: true, want: "anyone can write", make: func(t *testing.T, b string) string {
			mkdir(t, filepath.Join(b, "open"), 0o777)
			mkdir(t, filepath.Join(b, "open", "sub"), 0o755)
			link(t, filepath.Join(b, "open", "sub"), filepath.Join(b, "l"), -1)
			return filepath.Join(b, "l")
		}},
		{name: "another user's link", root: true, isDir: true, want: "the link", make: func(t *testing.T, b string) string {
			mkdir(t, filepath.Join(b, "real"), 0o755)
			return link(t, "real", filepath.Join(b, "l"), other)
		}},
		{name: "a chain through another user's link", root: true, isDir: true, want: "theirs belongs to uid 65534", make: func(t *testing.T, b string) string {
			mkdir(t, filepath.Join(b, "real"), 0o755)
			link(t, "real", filepath.Join(b, "theirs"), other)
			return link(t, "theirs", filepath.Join(b, "ours"), -1)
		}},
		{name: "ten links one after another", isDir: true, make: func(t *testing.T, b string) string {
			mkdir(t, filepath.Join(b, "d"), 0o755)
			link(t, ".", filepath.Join(b, "d", "l"), -1)
			return filepath.Join(b, "d", "l", "l", "l", "l", "l", "l", "l", "l", "l", "l")
		}},
		{name: "a link's .. where the link led", isDir: true, want: "anyone can write the directory", make: func(t *testing.T, b string) string {
			// v/t leads into a directory anyone can write (att/sub); v/logs
			// is "t/../x": the kernel goes to att/x, not v/x (the text
			// cleaned), and att/x is where the logs would go.
			mkdir(t, filepath.Join(b, "att"), 0o777)
			mkdir(t, filepath.Join(b, "att", "sub"), 0o755)
			mkdir(t, filepath.Join(b, "att", "x", "run"), 0o755)
			mkdir(t, filepath.Join(b, "v", "x", "run"), 0o755)
			link(t, filepath.Join(b, "att", "sub"), filepath.Join(b, "v", "t"), -1)
			link(t, "t/../x", filepath.Join(b, "v", "logs"), -1)
			return filepath.Join(b, "v", "logs", "run")
		}},
		{name: "Dir of a file", isDir: true, want: "is not a directory", make: func(t *testing.T, b string) string {
			return mkfile(t, filepath.Join(b, "f"), 0o644)
		}},
		{name: "own file", make: func(t *testing.T, b string) string {
			return mkfile(t, filepath.Join(mkdir(t, filepath.Join(b, "d"), 0o755), "f"), 0o755)
		}},
		{name: "file anyone can write", want: "anyone can write the file", make: func(t *testing.T, b string) string {
			return mkfile(t, filepath.Join(b, "f"), 0o666)
		}},
		{name: "file in a sticky directory anyone can write", make: func(t *testing.T, b string) string {
			return mkfile(t, filepath.Join(mkdir(t, filepath.Join(b, "d"), os.ModeSticky|0o777), "f"), 0o644)
		}},
		{name: "file in a directory anyone can write", want: "anyone can write the directory", make: func(t *testing.T, b string) string {
			return mkfile(t, filepath.Join(mkdir(t, filepath.Join(b, "d"), 0o777), "f"), 0o644)
		}},
		{name: "file group-writable, own group", make: func(t *testing.T, b string) string {
			f := mkfile(t, filepath.Join(b, "f"), 0o775)
			chown(t, f, -1, os.Getegid())
			return f
		}},
		{name: "file group-writable, another group", root: true, want: "group 65534", make: func(t *testing.T, b string) string {
			f := mkfile(t, filepath.Join(b, "f"), 0o775)
			chown(t, f, -1, other)
			return f
		}},
		{name: "another user's file", root: true, want: "the file", make: func(t *testing.T, b string) string {
			f := mkfile(t, filepath.Join(b, "f"), 0o644)
			chown(t, f, other, other)
			return f
		}},
		{name: "own link to own file", make: func(t *testing.T, b string) string {
			mkfile(t, filepath.Join(b, "f"), 0o644)
			return link(t, "f", filepath.Join(b, "l"), -1)
		}},
		{name: "another user's link to own file", root: true, want: "the link", make: func(t *testing.T, b string) string {
			mkfile(t, filepath.Join(b, "f"), 0o644)
			return link(t, "f", filepath.Join(b, "l"), other)
		}},
		{name: "File of a directory", want: "not a regular file", make: func(t *testing.T, b string) string {
			return mkdir(t, filepath.Join(b, "d"), 0o755)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.root && os.Geteuid() != 0 {
				t.Skip("needs root to give an entry to another user")
			}
			base := t.TempDir()
			if err := os.Chmod(base, 0o755); err != nil {
				t.Fatal(err)
			}
			p := c.make(t, base)
			var got string
			var err error
			if c.isDir {
				got, err = Dir(p, c.dir)
			} else {
				got, err = File(p, OwnGroup)
			}
			if c.want == "" {
				if err != nil {
					t.Fatalf("%s: %v, want it accepted", p, err)
				}
				want, _ := filepath.EvalSymlinks(p)
				if got != want {
					t.Fatalf("%s resolved to %q, want %q", p, got, want)
				}
				return
			}
			if err == nil {
				t.Fatalf("%s accepted (as %s), want an error with %q", p, got, c.want)
			}
			if !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%s: %v; want ErrUnsafe with %q", p, err, c.want)
			}
		})
	}
}

// TestLinkLoop: a loop of links is the kernel's ELOOP, not ErrUnsafe.
func TestLinkLoop(t *testing.T) {
	b := t.TempDir()
	link(t, "y", filepath.Join(b, "x"), -1)
	link(t, "x", filepath.Join(b, "y"), -1)
	_, err := Dir(filepath.Join(b, "y"), OwnGroup)
	if !errors.Is(err, syscall.ELOOP) || errors.Is(err, ErrUnsafe) {
		t.Fatalf("err = %v, want ELOOP alone", err)
	}
}

// TestMissing: a path that is not there is the file system's error, not
// ErrUnsafe (a caller tells "absent" from "planted").
func TestMissing(t *testing.T) {
	_, err := Dir(filepath.Join(t.TempDir(), "nope"), AnyGroup)
	if !errors.Is(err, os.ErrNotExist) || errors.Is(err, ErrUnsafe) {
		t.Fatalf("err = %v, want ErrNotExist alone", err)
	}
}

// TestRelative: a relative path is checked from the root, through the
// working directory's own path.
func TestRelative(t *testing.T) {
	base := t.TempDir()
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	mkdir(t, filepath.Join(base, "d"), 0o755)
	t.Chdir(base)
	got, err := Dir("d", OwnGroup)
	if want := filepath.Join(base, "d"); err != nil || got != want {
		t.Fatalf("Dir(d) = %q, %v; want %q", got, err, want)
	}
	if err := os.Chmod(base, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := Dir("d", OwnGroup); !errors.Is(err, ErrUnsafe) {
		t.Fatalf("under a directory anyone can write: %v, want ErrUnsafe", err)
	}
}
