package shm

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// holder starts the test binary as a process that creates a segment under
// name and holds it until killed; kill ends it and reaps it.
func holder(t *testing.T, name string) (kill func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "SHM_TEST_CHILD="+testPrefix(t), "SHM_TEST_CHILD_NAME="+name)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	kill = func() {
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		stdin.Close()
	}
	t.Cleanup(func() { kill(); Unlink(name) })
	line, err := bufio.NewReader(out).ReadString('\n')
	if got := strings.TrimSpace(line); err != nil || got != name || !exists(name) {
		t.Fatalf("child: %q %v", line, err)
	}
	return kill
}

// TestSweepsSpareHeldSegments: a segment that a live process holds is
// removed neither by SweepOrphans nor by RemovePrefix, although its name
// says its creator is gone: what a creator in another pid namespace looks
// like, and what a live job whose run id starts with a finished job's looks
// like to that job's sweep. Once the holder is killed, both remove it.
func TestSweepsSpareHeldSegments(t *testing.T) {
	const gonePID = 1<<22 + 1 // above every pid_max Linux allows
	for _, sweep := range []struct {
		name string
		run  func(prefix string) ([]string, error)
	}{
		{"SweepOrphans", func(string) ([]string, error) { return SweepOrphans() }},
		{"RemovePrefix", RemovePrefix},
	} {
		t.Run(sweep.name, func(t *testing.T) {
			p := testPrefix(t)
			name := fmt.Sprintf("%so%d.5-0123456789ab", p, gonePID)
			kill := holder(t, name)
			removed, err := sweep.run(p)
			if err != nil {
				t.Fatal(err)
			}
			if slices.Contains(removed, name) || !exists(name) {
				t.Fatalf("%s removed %s, which a live process holds", sweep.name, name)
			}
			kill()
			removed, err = sweep.run(p)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(removed, name) || exists(name) {
				t.Fatalf("%s kept %s after its holder died (removed %v)", sweep.name, name, removed)
			}
		})
	}
}

// TestSegmentHoldsLockUntilClose: Create and Open each hold the file's
// lock until Close; a closed creator whose name is still live (its pid
// runs) is kept by SweepOrphans, by the pid tag.
func TestSegmentHoldsLockUntilClose(t *testing.T) {
	p := testPrefix(t)
	name, err := NewName(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Unlink(name) })
	c, err := Create(name, 1<<12)
	if err != nil {
		t.Fatal(err)
	}
	o, err := Open(name, 1<<12, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, step := range []struct {
		close func() error
		held  bool
	}{
		{func() error { return nil }, true},
		{c.Close, true}, // the opener still holds it
		{o.Close, false},
	} {
		if err := step.close(); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(Dir + "/" + name)
		if err != nil {
			t.Fatal(err)
		}
		held := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil
		f.Close()
		if held != step.held {
			t.Errorf("step %d: lock held %v, want %v", i, held, step.held)
		}
	}
	if removed, _ := SweepOrphans(); slices.Contains(removed, name) || !exists(name) {
		t.Errorf("SweepOrphans removed %s of a live creator", name)
	}
	if removed, _ := RemovePrefix(p); !slices.Contains(removed, name) || exists(name) {
		t.Errorf("RemovePrefix kept %s, which nobody holds (removed %v)", name, removed)
	}
}

// TestRemovePrefixSparesOtherUsers: a launcher run as root, whose job's
// prefix another user's live job shares (run id "abc" against
// "abc-def"), leaves that user's segments and links: only root could
// unlink them in the sticky /dev/shm, and it removed them without a look
// at the lock their job holds, so that the other job's ranks still to
// open a segment failed.
func TestRemovePrefixSparesOtherUsers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: only root can unlink another user's names in /dev/shm")
	}
	p := testPrefix(t)
	seg, err := NewName(p + "def-")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Create(seg, 1<<12) // held (its shared lock) until Close
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); Unlink(seg) })
	link := p + "def-link"
	if err := os.Symlink("/nonexistent", Dir+"/"+link); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Unlink(link) })
	for _, n := range []string{seg, link} {
		if err := os.Lchown(Dir+"/"+n, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := RemovePrefix(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{seg, link} {
		if slices.Contains(removed, n) || !exists(n) {
			t.Errorf("RemovePrefix removed %s, another user's (removed %v)", n, removed)
		}
	}
}
