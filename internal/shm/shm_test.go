package shm

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/machine"
)

// testPrefix starts the names a test makes: under testSweepPrefix, which
// only this package's sweeps look at, so that tests of other packages
// running at the same time (whose Init sweeps /dev/shm) leave them alone.
func testPrefix(t *testing.T) string {
	return fmt.Sprintf("%s%d-%s-", testSweepPrefix, os.Getpid(), strings.ReplaceAll(t.Name(), "/", "."))
}

const testSweepPrefix = "slimegotest-"

func exists(name string) bool {
	_, err := os.Lstat(filepath.Join(Dir, name))
	return err == nil
}

// TestMain lets the test binary play a process that creates a segment and
// then waits to be killed (SHM_TEST_CHILD=<prefix>): it prints the name.
// With SHM_TEST_CHILD_NAME it creates the segment under that name, as it
// is (a forged owner tag), instead of one NewName makes.
func TestMain(m *testing.M) {
	sweepPrefix = testSweepPrefix
	if prefix := os.Getenv("SHM_TEST_CHILD"); prefix != "" {
		name, err := NewName(prefix)
		if forged := os.Getenv("SHM_TEST_CHILD_NAME"); forged != "" {
			name = forged
		}
		if err == nil {
			_, err = Create(name, 1<<16)
		}
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println(name)
		io.Copy(io.Discard, os.Stdin) // until the parent kills us
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestSweepOrphansKilledCreator: a segment whose creator was SIGKILLed
// before anyone unlinked it is removed by SweepOrphans; while the creator
// lives it is kept.
func TestSweepOrphansKilledCreator(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "SHM_TEST_CHILD="+testPrefix(t))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	name := strings.TrimSpace(line)
	if err != nil || strings.HasPrefix(name, "error") || !exists(name) {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("child: %q %v", line, err)
	}
	t.Cleanup(func() { Unlink(name) })
	if !strings.Contains(name, fmt.Sprintf("-o%d.", cmd.Process.Pid)) {
		t.Errorf("name %s does not carry the creator's pid %d", name, cmd.Process.Pid)
	}
	removed, err := SweepOrphans()
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(removed, name) || !exists(name) {
		t.Fatalf("segment %s of a live process removed", name)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	// Not reaped yet (a zombie, as the child of a killed launcher is until
	// init reaps it): it holds nothing and its pid is not given out again,
	// so it is gone.
	for deadline := time.Now().Add(10 * time.Second); machine.Alive(cmd.Process.Pid); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the killed child did not become a zombie")
		}
	}
	removed, err = SweepOrphans()
	cmd.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(removed, name) || exists(name) {
		t.Fatalf("segment %s of a killed, unreaped process not removed (removed %v)", name, removed)
	}
}

// TestSweepOrphansTags: which names SweepOrphans removes, forged where the
// real thing cannot be arranged (a pid reused by a process started later).
func TestSweepOrphansTags(t *testing.T) {
	p := testPrefix(t)
	self, err := startTime("self")
	if err != nil {
		t.Fatal(err)
	}
	pid := os.Getpid()
	const gonePID = 1<<22 + 1 // above every pid_max Linux allows
	cases := []struct {
		name   string
		kind   string // file, link
		remove bool
	}{
		{fmt.Sprintf("%so%d.%d-0123456789ab", p, pid, self), "file", false},        // live creator
		{fmt.Sprintf("%so%d.%d-0123456789ab", p, pid, self+1), "file", true},       // pid reused
		{fmt.Sprintf("%so%d.%d-0123456789ab", p, gonePID, 5), "file", true},        // creator gone
		{fmt.Sprintf("%so%d.%d-link0123456789ab", p, gonePID, 5), "link", false},   // not a regular file
		{fmt.Sprintf("%so%d.%d-0123456789ac", p, gonePID, 5) + "x", "file", false}, // no tag at the end
		{p + "untagged", "file", false},                                            // no tag
		{fmt.Sprintf("other-o%d.%d-0123456789ab", gonePID, 5), "file", false},      // not slimego's
	}
	target := filepath.Join(t.TempDir(), "target")
	os.WriteFile(target, []byte("x"), 0o600)
	for _, c := range cases {
		path := filepath.Join(Dir, c.name)
		if c.kind == "link" {
			err = os.Symlink(target, path)
		} else {
			err = os.WriteFile(path, []byte("segment"), 0o600)
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(path) })
	}
	removed, err := SweepOrphans()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		if got := slices.Contains(removed, c.name); got != c.remove || exists(c.name) == c.remove {
			t.Errorf("%s: removed %v, want %v", c.name, got, c.remove)
		}
	}
	if b, err := os.ReadFile(target); err != nil || string(b) != "x" {
		t.Errorf("link target touched: %q %v", b, err)
	}
}

// TestParseStartTime: the command name may hold spaces and parentheses.
func TestParseStartTime(t *testing.T) {
	rest := "S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 424242 20 21"
	for _, comm := range []string{"(sh)", "(a b)", "(x) (y))", "()"} {
		got, err := parseStartTime("1", []byte("123 "+comm+" "+rest))
		if err != nil || got != 424242 {
			t.Errorf("%s: %d %v", comm, got, err)
		}
	}
	for _, bad := range []string{"", "1 (x", "1 (x) S 1 2", "1 (x) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 -3"} {
		if _, err := parseStartTime("1", []byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func FuzzParseStartTime(f *testing.F) {
	if b, err := os.ReadFile("/proc/self/stat"); err == nil {
		f.Add(b)
	}
	f.Add([]byte("1 (a) b) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 99"))
	f.Fuzz(func(t *testing.T, b []byte) { parseStartTime("1", b) })
}

// TestCreateTooLarge: a size above every limit is ErrNoSpace, at once,
// and leaves no file.
func TestCreateTooLarge(t *testing.T) {
	name, err := NewName(testPrefix(t))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	s, err := Create(name, 1<<50)
	if err == nil {
		s.Close()
		Unlink(name)
		t.Fatal("a 1 PiB segment was created")
	}
	if !errors.Is(err, ErrNoSpace) || !strings.Contains(err.Error(), "1125899906842624 bytes") {
		t.Errorf("want ErrNoSpace naming the size, got %v", err)
	}
	t.Log(err)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v", d)
	}
	if exists(name) {
		Unlink(name)
		t.Errorf("%s left in %s", name, Dir)
	}
}

// TestCheckSpaceTightest: one byte more than the tightest limit is refused
// with that limit named; a page is accepted.
func TestCheckSpaceTightest(t *testing.T) {
	rs := rooms()
	if len(rs) == 0 {
		t.Skip("no limit readable")
	}
	tight := slices.MinFunc(rs, func(a, b room) int { return int(min(max(a.bytes-b.bytes, -1), 1)) })
	t.Logf("limits: %v", rs)
	// Other processes move the numbers; a margin of 1 GiB keeps the test
	// deterministic on a quiet machine.
	err := CheckSpace(tight.bytes + 1<<30)
	if !errors.Is(err, ErrNoSpace) {
		t.Errorf("%d bytes: want ErrNoSpace, got %v", tight.bytes+1<<30, err)
	}
	if err := CheckSpace(4096); err != nil {
		t.Errorf("a page: %v", err)
	}
}

// TestOpenRefuses: Open maps nothing but a regular file of ours, of the
// expected size, whose header the caller accepts, and never blocks on a
// FIFO; the header check sees only the first page.
func TestOpenRefuses(t *testing.T) {
	p := testPrefix(t)
	const size = 3 * 4096
	name, _ := NewName(p)
	s, err := Create(name, size)
	if err != nil {
		t.Fatal(err)
	}
	defer Unlink(name)
	defer s.Close()
	copy(s.Mem, "HEAD")
	good := func(head []byte) error {
		if len(head) != os.Getpagesize() {
			return fmt.Errorf("check saw %d bytes", len(head))
		}
		if string(head[:4]) != "HEAD" {
			return errors.New("bad header")
		}
		return nil
	}
	o, err := Open(name, size, good)
	if err != nil {
		t.Fatalf("good segment: %v", err)
	}
	o.Mem[size-1] = 7
	if s.Mem[size-1] != 7 {
		t.Error("mappings do not share memory")
	}
	o.Close()

	fifo := p + "fifo"
	if err := syscall.Mkfifo(filepath.Join(Dir, fifo), 0o600); err != nil {
		t.Fatal(err)
	}
	defer Unlink(fifo)
	dir := p + "dir"
	os.Mkdir(filepath.Join(Dir, dir), 0o700)
	defer os.Remove(filepath.Join(Dir, dir))
	link := p + "link"
	os.Symlink(filepath.Join(Dir, name), filepath.Join(Dir, link))
	defer Unlink(link)

	cases := []struct {
		name  string
		size  int
		check func([]byte) error
		want  error
	}{
		{name, size + 4096, good, ErrWrongSize},
		{name, size, func([]byte) error { return errors.New("no") }, ErrForeign},
		{link, size, good, ErrForeign},
		{fifo, size, good, ErrForeign},
		{dir, size, good, nil}, // EISDIR from open
		{"../tmp/x", size, good, ErrBadName},
		{"/etc/passwd", size, good, ErrBadName},
		{"..", size, good, ErrBadName},
		{"", size, good, ErrBadName},
	}
	for _, c := range cases {
		o, err := Open(c.name, c.size, c.check)
		if err == nil {
			o.Close()
			t.Errorf("%q: opened", c.name)
			continue
		}
		if c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("%q: want %v, got %v", c.name, c.want, err)
		}
	}
	if err := Unlink("../" + name); !errors.Is(err, ErrBadName) {
		t.Errorf("Unlink with a path: %v", err)
	}
}

func TestCheckName(t *testing.T) {
	const p = "slimego-job-world-seg-"
	ok := []string{p + "o1.2-abcdef", p + "x"}
	bad := []string{"", "slimego-job-world-buf0-x", p + "a/b", p + "..", p + "a..b", p + "a\x00", p + "é",
		p + " ", "../" + p, p + strings.Repeat("a", MaxName-len(p)+1)}
	for _, n := range ok {
		if err := CheckName(n, p); err != nil {
			t.Errorf("%q: %v", n, err)
		}
	}
	for _, n := range bad {
		if err := CheckName(n, p); !errors.Is(err, ErrBadName) {
			t.Errorf("%q: accepted (%v)", n, err)
		}
	}
	if err := CheckName(p+"x", ""); err == nil {
		t.Error("empty prefix accepted")
	}
}

// FuzzCheckName: whatever a store holds, an accepted name is one plain
// file name in Dir with the group's prefix.
func FuzzCheckName(f *testing.F) {
	const p = "slimego-job-world-seg-"
	for _, s := range []string{p + "o1.2-ab", "../../etc/passwd", p + "../x", p + "a/b", "/abs"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if CheckName(name, p) != nil {
			return
		}
		if !strings.HasPrefix(name, p) || len(name) > MaxName || strings.ContainsAny(name, "/\x00") ||
			strings.Contains(name, "..") || filepath.Base(filepath.Join(Dir, name)) != name || plainName(name) != nil {
			t.Errorf("accepted %q", name)
		}
	})
}

// TestNewName: names carry this process's tag and differ.
func TestNewName(t *testing.T) {
	a, err := NewName("slimego-x-")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := NewName("slimego-x-")
	m := ownerRE.FindStringSubmatch(a)
	if a == b || m == nil || m[1] != fmt.Sprint(os.Getpid()) {
		t.Errorf("names %q, %q", a, b)
	}
}

// TestWalkCgroup: every level's limit up to the root counts; "max" is none.
func TestWalkCgroup(t *testing.T) {
	root := t.TempDir()
	write := func(dir, file, v string) {
		os.MkdirAll(filepath.Join(root, dir), 0o700)
		if err := os.WriteFile(filepath.Join(root, dir, file), []byte(v+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("", "memory.max", "max")
	write("job", "memory.max", "3221225472")
	write("job", "memory.current", "1073741824")
	write("job/rank", "memory.max", "max")
	write("job/rank", "memory.current", "5")
	rs := walkCgroup(root, "/job/rank", "memory.max", "memory.current")
	if len(rs) != 1 || rs[0].bytes != 2<<30 || !strings.Contains(rs[0].what, filepath.Join(root, "job", "memory.max")) {
		t.Fatalf("rooms %v", rs)
	}
	// A path outside the root is clamped inside it.
	if rs := walkCgroup(root, "/../../job", "memory.max", "memory.current"); len(rs) != 1 {
		t.Errorf("rooms %v", rs)
	}
	write("job/rank", "memory.max", "1000")
	rs = walkCgroup(root, "/job/rank", "memory.max", "memory.current")
	if len(rs) != 2 || rs[0].bytes != 995 {
		t.Errorf("rooms %v", rs)
	}
}
