package launcher

import (
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestGuardNamed: the guard process shows as slimerun-guard in ps, by its
// command line (ps -ef, ps aux) as by its name (ps -e), not as
// /proc/self/exe, the file it was started from.
func TestGuardNamed(t *testing.T) {
	g, err := startGuard(io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer g.close()
	proc := "/proc/" + strconv.Itoa(g.cmd.Process.Pid)
	// Start returns once the exec has closed the descriptors marked
	// close-on-exec, which the kernel does before it lays out the new
	// command line: until then /proc reads it empty.
	var b []byte
	for end := time.Now().Add(5 * time.Second); len(b) == 0 && time.Now().Before(end); time.Sleep(time.Millisecond) {
		if b, err = os.ReadFile(proc + "/cmdline"); err != nil {
			t.Fatal(err)
		}
	}
	if argv0, _, _ := strings.Cut(string(b), "\x00"); argv0 != "slimerun-guard" {
		t.Errorf("the guard's command line starts %q, want slimerun-guard", argv0)
	}
	comm := ""
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		b, _ := os.ReadFile(proc + "/comm")
		if comm = strings.TrimSpace(string(b)); comm == "slimerun-guard" {
			return
		}
	}
	t.Errorf("the guard's name is %q, want slimerun-guard", comm)
}
