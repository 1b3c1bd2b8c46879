package launcher

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A worker whose @record-wrapped entry point failed wrote its exception
// to TORCHELASTIC_ERROR_FILE; the job's error carries it. Each worker has
// a file of its own (not the launcher's own, in a nested launch), and the
// directory they lie in is gone once Run has returned.
func TestErrorFileMessage(t *testing.T) {
	tmp := t.TempDir()
	outer := filepath.Join(tmp, "outer.json")
	env := []string{"PATH=" + os.Getenv("PATH"), "TMPDIR=" + tmp, "TORCHELASTIC_ERROR_FILE=" + outer}
	script := `echo "F=$TORCHELASTIC_ERROR_FILE"
if [ "$LOCAL_RANK" = 1 ]; then
  printf '{"message": {"message": "RuntimeError: CUDA out of memory\\ntraceback follows", "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "1"}}}' > "$TORCHELASTIC_ERROR_FILE"
  exit 3
fi
sleep 30`
	out, _, err := run(t, Config{NProcPerNode: 2, Env: env}, script)
	var je *JobError
	if !errors.As(err, &je) {
		t.Fatalf("err %v, want a JobError\n%s", err, out)
	}
	t.Logf("%v", err)
	if je.First.Rank != 1 || je.First.Message != "RuntimeError: CUDA out of memory\ntraceback follows" {
		t.Errorf("first failure %+v: want rank 1 with its error file's message", je.First)
	}
	if !strings.Contains(err.Error(), "exited with code 3: RuntimeError: CUDA out of memory …") {
		t.Errorf("the error does not give the message's first line: %v", err)
	}
	files := map[string]bool{}
	for _, l := range strings.Split(out, "\n") {
		if _, f, ok := strings.Cut(l, "F="); ok {
			files[f] = true
			if f == "" || f == outer {
				t.Errorf("a worker's TORCHELASTIC_ERROR_FILE is %q", f)
			}
		}
	}
	if len(files) != 2 {
		t.Errorf("want 2 error files, one per worker: %v", files)
	}
	if _, err := os.Stat(outer); err == nil {
		t.Errorf("the launcher's own error file was written")
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("left in TMPDIR: %v", left)
	}
}

// The error file is the worker's to write: a FIFO, a link, a huge file or
// junk there gives no message, and Run returns as without one.
func TestErrorFileHostile(t *testing.T) {
	for _, tc := range []struct{ name, script string }{
		{"fifo", `rm -f "$TORCHELASTIC_ERROR_FILE"; mkfifo "$TORCHELASTIC_ERROR_FILE"; exit 1`},
		{"link", `ln -sf /etc/passwd "$TORCHELASTIC_ERROR_FILE"; exit 1`},
		{"dir", `mkdir "$TORCHELASTIC_ERROR_FILE"; exit 1`},
		{"huge", `head -c 2000000 /dev/zero | tr '\0' ' ' > "$TORCHELASTIC_ERROR_FILE"; printf '{"message": "x"}' >> "$TORCHELASTIC_ERROR_FILE"; exit 1`},
		{"junk", `printf '{"message": 7}' > "$TORCHELASTIC_ERROR_FILE"; exit 1`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := run(t, Config{NProcPerNode: 1, Env: []string{"PATH=" + os.Getenv("PATH"), "TMPDIR=" + t.TempDir()}}, tc.script)
			var je *JobError
			if !errors.As(err, &je) || je.First.ExitCode != 1 {
				t.Fatalf("err %v, want exit code 1\n%s", err, out)
			}
			if je.First.Message != "" {
				t.Errorf("message %q from a file that is not one", je.First.Message)
			}
		})
	}
}

func TestParseErrorFile(t *testing.T) {
	long := strings.Repeat("é", maxErrorMessage)
	for _, tc := range []struct{ in, want string }{
		{`{"message": {"message": "ValueError: bad", "extraInfo": {}}}`, "ValueError: bad"},
		{`{"message": "plain text"}`, "plain text"},
		{`{"message": "a\u001b[31mred\u0007"}`, "a [31mred"},
		{`{"message": ` + `"` + long + `"}`, strings.Repeat("é", maxErrorMessage/2) + " …"},
		{`{"message": 7}`, ""},
		{`{}`, ""},
		{`Fatal Python error: Segmentation fault`, ""}, // faulthandler's, not JSON
	} {
		if got := parseErrorFile([]byte(tc.in)); got != tc.want {
			t.Errorf("parseErrorFile(%.40q) = %.60q, want %.60q", tc.in, got, tc.want)
		}
	}
}

func FuzzParseErrorFile(f *testing.F) {
	f.Add([]byte(`{"message": {"message": "E: x", "extraInfo": {"py_callstack": "tb", "timestamp": "1"}}}`))
	f.Add([]byte(`{"message": "x"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s := parseErrorFile(b)
		if len(s) > maxErrorMessage+len(" …") {
			t.Fatalf("%d bytes", len(s))
		}
		for _, r := range s {
			if r != '\n' && r != '\t' && (r < 0x20 || r == 0x7f) {
				t.Fatalf("control character %q in %q", r, s)
			}
		}
	})
}

// TestErrorFileNoneInherited: where the launcher cannot make a worker's
// error file (its log directory cannot be made), the worker is given
// none, and in particular not the TORCHELASTIC_ERROR_FILE of the
// launcher's own environment (a launch within a torchrun worker), which
// the worker's failure would overwrite.
func TestErrorFileNoneInherited(t *testing.T) {
	tmp := t.TempDir()
	outer := filepath.Join(tmp, "outer.json")
	blocker := filepath.Join(tmp, "file")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=" + os.Getenv("PATH"), "TORCHELASTIC_ERROR_FILE=" + outer}
	out, _, err := run(t, Config{NProcPerNode: 1, Env: env, LogDir: filepath.Join(blocker, "logs")}, `echo "F=${TORCHELASTIC_ERROR_FILE-unset}"`)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "F=unset") {
		t.Fatalf("the worker was given an error file though none could be made:\n%s", out)
	}
}
