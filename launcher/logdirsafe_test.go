package launcher

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// plantLogs lays out, under base, the log directory of run id run's
// local rank 0 as another user could have left it before the run (the run
// id is predictable: "p<port>" without --rdzv-id): its stdout.log a
// symbolic link to victim. It returns the leaf directory.
func plantLogs(t *testing.T, base, run, victim string) string {
	t.Helper()
	leaf := filepath.Join(base, run, "attempt_0", "0")
	if err := os.MkdirAll(leaf, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(leaf, "stdout.log")); err != nil {
		t.Fatal(err)
	}
	return leaf
}

// TestLogDirPlantedLinkRefused: a log directory that someone else can
// write (or owns) is not written into: a link planted there at a worker's
// log file's predictable name made the launcher truncate and overwrite
// the file it points to (any file the launcher's user can write, root's
// included), and a link or directory planted higher up sent the logs
// anywhere. The job fails instead, naming the directory, and the file the
// link points to is untouched.
func TestLogDirPlantedLinkRefused(t *testing.T) {
	check := func(t *testing.T, base, runID, victim string) {
		t.Helper()
		_, stderr, err := run(t, Config{NProcPerNode: 1, LogDir: base, RunID: runID, Redirects: []Std{Stdout}}, "echo OVERWRITTEN")
		if b, _ := os.ReadFile(victim); string(b) != "precious\n" {
			t.Errorf("the file the planted link points to holds %q, want it untouched", b)
		}
		if err == nil || !strings.Contains(err.Error(), "log") {
			t.Errorf("err = %v; want the job refused for its log directory\n%s", err, stderr)
		}
	}
	newVictim := func(t *testing.T) string {
		victim := filepath.Join(t.TempDir(), "victim")
		if err := os.WriteFile(victim, []byte("precious\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return victim
	}

	t.Run("writable by others", func(t *testing.T) {
		base, victim := t.TempDir(), newVictim(t)
		leaf := plantLogs(t, base, "planted", victim)
		for d := leaf; d != base; d = filepath.Dir(d) {
			if err := os.Chmod(d, 0o777); err != nil { // as its maker left it for anyone
				t.Fatal(err)
			}
		}
		check(t, base, "planted", victim)
	})
	t.Run("another user's", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root to give the directory to another user")
		}
		base, victim := t.TempDir(), newVictim(t)
		leaf := plantLogs(t, base, "planted", victim)
		for d := filepath.Join(leaf, "stdout.log"); d != base; d = filepath.Dir(d) {
			if err := os.Lchown(d, 65534, 65534); err != nil {
				t.Fatal(err)
			}
		}
		check(t, base, "planted", victim)
	})
	t.Run("a link to a directory of ours", func(t *testing.T) {
		// A link that another user planted, to a directory of the
		// launcher's user: the logs would go where the link says.
		if os.Geteuid() != 0 {
			t.Skip("needs root to plant a link as another user")
		}
		base, victim := t.TempDir(), newVictim(t)
		elsewhere := t.TempDir()
		plantLogs(t, elsewhere, "x", victim)
		if err := os.Symlink(filepath.Join(elsewhere, "x"), filepath.Join(base, "planted")); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(filepath.Join(base, "planted"), 65534, 65534); err != nil {
			t.Fatal(err)
		}
		check(t, base, "planted", victim)
	})
	t.Run("own directory still used", func(t *testing.T) {
		// The same layout made by the launcher's own user, minus the link,
		// is used as before (a run again with the same run id).
		base := t.TempDir()
		if err := os.MkdirAll(filepath.Join(base, "mine", "attempt_0", "0"), 0o755); err != nil {
			t.Fatal(err)
		}
		if _, stderr, err := run(t, Config{NProcPerNode: 1, LogDir: base, RunID: "mine", Redirects: []Std{Stdout}}, "echo fine"); err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		if b, err := os.ReadFile(filepath.Join(base, "mine", "attempt_0", "0", "stdout.log")); err != nil || string(b) != "fine\n" {
			t.Fatalf("stdout.log: %q, %v", b, err)
		}
	})
}

// TestLogDirLinkChainChecked: every link of a chain on the log
// directory's path is checked, not the first alone: a link of ours that
// points through another user's link (which its owner may repoint after
// the check) to a directory of ours is refused. (The chain was resolved at
// once, and only its first link's owner and the final directory checked.)
func TestLogDirLinkChainChecked(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a link of another user")
	}
	base := t.TempDir()
	real := filepath.Join(base, "real")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	theirs := filepath.Join(base, "theirs")
	if err := os.Symlink(real, theirs); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(theirs, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	ours := filepath.Join(base, "ours")
	if err := os.Symlink(theirs, ours); err != nil {
		t.Fatal(err)
	}
	if err := secureDir(ours); err == nil || !strings.Contains(err.Error(), theirs) {
		t.Fatalf("a chain through another user's link %s: %v, want it refused naming that link", theirs, err)
	}
	if err := secureDir(real); err != nil {
		t.Fatalf("the directory itself: %v", err)
	}
}
