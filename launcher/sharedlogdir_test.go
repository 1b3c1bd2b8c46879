package launcher

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestSharedLogDirAcrossNodes: nodes given the same --log-dir (a shared
// file system, or nodes that are namespaces of one machine) keep every
// rank's logs and error file, as torchrun's agents do (each writes under
// a directory of its own): local rank 0 of node 1 must not write over
// local rank 0 of node 0.
func TestSharedLogDirAcrossNodes(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var outs [2]syncBuffer
	script := `echo "out-$RANK"; echo "err-$RANK" >&2; echo "$TORCHELASTIC_ERROR_FILE" > "$0/errfile.$RANK"; sleep 0.3`
	chs := startTwoNodes(ctx, t, "sharedlogs", script, &outs, func(n int, c *Config) context.Context {
		c.LogDir = dir
		c.Redirects = []Std{Stdout | Stderr}
		c.Args = append(c.Args, dir)
		return nil
	})
	for n := range 2 {
		if err := result(chs[n], "node "+string(rune('0'+n))); err != nil {
			t.Fatalf("node %d: %v\n%s", n, err, outs[n].String())
		}
	}
	logs := map[string][]string{} // file name -> contents, sorted
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".log") {
			b, _ := os.ReadFile(p)
			logs[d.Name()] = append(logs[d.Name()], string(b))
		}
		return nil
	})
	for name, want := range map[string][]string{"stdout.log": {"out-0\n", "out-1\n"}, "stderr.log": {"err-0\n", "err-1\n"}} {
		slices.Sort(logs[name])
		if !slices.Equal(logs[name], want) {
			t.Errorf("the %s files under the shared log directory hold %q, want %q (one per rank)", name, logs[name], want)
		}
	}
	var files [2]string
	for r := range 2 {
		b, err := os.ReadFile(filepath.Join(dir, "errfile."+string(rune('0'+r))))
		if err != nil {
			t.Fatal(err)
		}
		files[r] = strings.TrimSpace(string(b))
	}
	if files[0] == "" || files[0] == files[1] {
		t.Errorf("ranks 0 and 1 (nodes 0 and 1) were given the error files %q and %q, want two", files[0], files[1])
	}
}
