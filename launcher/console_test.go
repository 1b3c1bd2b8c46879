package launcher

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// brokenPipe is a console whose reader has gone (slimerun ... | head):
// every write fails with EPIPE.
type brokenPipe struct{}

func (brokenPipe) Write([]byte) (int, error) { return 0, syscall.EPIPE }

// TestConsoleGoneWarned: when the console's standard output goes away,
// the workers go on (their output must not kill them) and their console
// output is dropped, as before, but the launcher says so once on
// standard error rather than drop it without a word.
func TestConsoleGoneWarned(t *testing.T) {
	var errb syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := Run(ctx, Config{NProcPerNode: 2, Standalone: true, StopGrace: time.Second,
		Program: "sh", Args: []string{"-c", "for i in 1 2 3; do echo line $i; done"},
		Env: []string{"PATH=" + os.Getenv("PATH")}, Stdout: brokenPipe{}, Stderr: &errb})
	if err != nil {
		t.Fatalf("the workers must not fail for a console gone: %v\n%s", err, errb.String())
	}
	if n := strings.Count(errb.String(), "standard output is gone"); n != 1 {
		t.Errorf("%d warnings of the console gone, want 1:\n%s", n, errb.String())
	}
}

// waitFor waits up to limit for s to read want, and returns what it reads.
func waitFor(s *syncBuffer, want string, limit time.Duration) string {
	for end := time.Now().Add(limit); ; time.Sleep(10 * time.Millisecond) {
		if got := s.String(); got == want || time.Now().After(end) {
			return got
		}
	}
}

// TestPrefixWriterPrompt: a partial line that waits (a prompt: pdb's
// "(Pdb) ", input()) reaches the console behind its prefix, and its
// continuation follows it without a second prefix; another writer's line
// in between first ends it with a newline (the rest then has its prefix
// again); flush ends a line left shown and unfinished.
func TestPrefixWriterPrompt(t *testing.T) {
	var out syncBuffer
	con := new(console)
	p := &prefixWriter{con: con, out: &out, prefix: "[0]: "}
	q := &prefixWriter{con: con, out: &out, prefix: "[1]: "}
	want := ""
	step := func(what string, w *prefixWriter, s, shows string) {
		t.Helper()
		w.Write([]byte(s))
		want += shows
		if got := waitFor(&out, want, 5*time.Second); got != want {
			t.Fatalf("%s: the console reads %q, want %q", what, got, want)
		}
	}
	step("a prompt", p, "(Pdb) ", "[0]: (Pdb) ")
	step("its answer", p, "10\n", "10\n")
	step("a prompt again", p, "(Pdb) ", "[0]: (Pdb) ")
	step("another rank's line", q, "hello\n", "\n[1]: hello\n")
	step("the rest, after it", p, "20\n", "[0]: 20\n")
	step("a line written slowly", p, "loading... ", "[0]: loading... ")
	step("its end", p, "done\n", "done\n")
	step("a partial line", p, " 10%", "[0]:  10%")
	// Rewritten in place: from its '\r' on, a progress bar's update,
	// shown when it ends (not by the timer).
	step("its update", p, "\r 20%", "\r")
	step("a last partial line", p, "\nbye", "[0]:  20%\n[0]: bye")
	p.flush()
	if got := out.String(); got != want+"\n" {
		t.Fatalf("after flush the console reads %q, want %q", got, want+"\n")
	}
}

// TestPromptShown: a worker's prompt (no newline) reaches slimerun's
// console while the worker waits, not only when it exits.
func TestPromptShown(t *testing.T) {
	var out, errb syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{NProcPerNode: 1, Standalone: true, StopGrace: time.Second,
			Program: "sh", Args: []string{"-c", "printf 'name? '; sleep 3; echo"},
			Env: []string{"PATH=" + os.Getenv("PATH")}, Stdout: &out, Stderr: &errb})
	}()
	if got := waitFor(&out, "[0]: name? ", 2*time.Second); got != "[0]: name? " {
		t.Errorf("2 s into the worker's wait the console reads %q, want the prompt", got)
	}
	if err := <-done; err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	if got := out.String(); got != "[0]: name? \n" {
		t.Errorf("at the end the console reads %q", got)
	}
}

// TestLogDirAnnounced: output redirected without a log directory goes to
// a new one, which the launcher names even when it reports no progress
// (slimerun -q): it was made silently, and the user could not find it.
func TestLogDirAnnounced(t *testing.T) {
	var out, errb syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var warned []string
	err := Run(ctx, Config{NProcPerNode: 1, Standalone: true, StopGrace: time.Second, Redirects: []Std{Stdout},
		Program: "sh", Args: []string{"-c", "echo redirected"},
		Env: []string{"PATH=" + os.Getenv("PATH")}, Stdout: &out, Stderr: &errb,
		Warnf: func(f string, a ...any) { warned = append(warned, fmt.Sprintf(f, a...)) }})
	if err != nil {
		t.Fatal(err)
	}
	var dir string
	for _, w := range warned {
		if i := strings.Index(w, os.TempDir()+"/slimerun-"); i >= 0 {
			dir = strings.Fields(w[i:])[0]
		}
	}
	if dir == "" {
		t.Fatalf("no warning names the log directory made: %q", warned)
	}
	defer os.RemoveAll(dir)
	logs, _ := filepath.Glob(filepath.Join(dir, "*", "attempt_0", "0", "stdout.log"))
	if len(logs) != 1 {
		t.Fatalf("%s holds no stdout.log of rank 0", dir)
	}
	if b, _ := os.ReadFile(logs[0]); string(b) != "redirected\n" {
		t.Fatalf("%s reads %q", logs[0], b)
	}
}

// TestPrefixWriterBars: two ranks' progress bars ("\r 10%" … updates with
// no newline, slower than partialDelay) reach the console as before, each
// update when its next begins, rewritten in place: no partial line of
// theirs is shown by the timer and then ended by the other rank's, which
// made the console scroll a line per update.
func TestPrefixWriterBars(t *testing.T) {
	var out syncBuffer
	con := new(console)
	p := &prefixWriter{con: con, out: &out, prefix: "[0]: "}
	q := &prefixWriter{con: con, out: &out, prefix: "[1]: "}
	for i := range 3 {
		p.Write([]byte(fmt.Sprintf("\r %d0%%", i+1)))
		time.Sleep(2 * partialDelay)
		q.Write([]byte(fmt.Sprintf("\r %d5%%", i+1)))
		time.Sleep(2 * partialDelay)
	}
	if got, want := out.String(), "[0]:  10%\r[1]:  15%\r[0]:  20%\r[1]:  25%\r"; got != want {
		t.Fatalf("the console reads %q, want %q", got, want)
	}
}

// TestPrefixWriterGone: once the console is gone (its reader closed),
// a worker's output is dropped, not gathered in memory.
func TestPrefixWriterGone(t *testing.T) {
	p := &prefixWriter{con: new(console), out: brokenPipe{}, prefix: "[0]: "}
	p.Write([]byte("a line\n"))
	chunk := bytes.Repeat([]byte("x"), 1<<10)
	for range 100 {
		if n, err := p.Write(chunk); n != len(chunk) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	p.con.mu.Lock()
	defer p.con.mu.Unlock()
	if len(p.buf) != 0 {
		t.Fatalf("%d bytes held for a console that is gone", len(p.buf))
	}
}
