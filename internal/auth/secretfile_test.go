package auth

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestReadSecretFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, path, want, err string
	}{
		{"600", write("a", "  s3cret \nrest\n", 0o600), "s3cret", ""},
		{"400", write("b", "s3cret", 0o400), "s3cret", ""},
		{"644", write("c", "s3cret\n", 0o644), "", "mode 0644"},
		{"640", write("d", "s3cret\n", 0o640), "", "mode 0640"},
		{"empty first line", write("e", "\ns3cret\n", 0o600), "", "no secret"},
		{"directory", dir, "", "not a regular file"},
		{"fifo", fifo, "", "not a regular file"},
		{"missing", filepath.Join(dir, "nope"), "", "no such file"},
		{"huge", write("f", strings.Repeat("x", 1<<20), 0o600), strings.Repeat("x", 64<<10), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan struct{})
			var got []byte
			var err error
			go func() { got, err = ReadSecretFile(tc.path); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("ReadSecretFile blocked")
			}
			if tc.err != "" {
				if !errors.Is(err, ErrSecretFile) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want ErrSecretFile containing %q", err, tc.err)
				}
				return
			}
			if err != nil || string(got) != tc.want {
				t.Fatalf("got %d bytes, %v; want %d bytes", len(got), err, len(tc.want))
			}
		})
	}
}

// TestReadSecretFileOwner: a secret file of mode 600 that belongs to
// another user is refused: its owner reads it whatever its mode (and can
// change it), so that user could join the job, or have chosen its secret
// (a file planted at a path the job's user names, say /tmp/job.secret).
// A file of root's is accepted, as ssh accepts one.
func TestReadSecretFileOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give the file to another user")
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "secret")
	if err := os.WriteFile(p, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadSecretFile(p); !errors.Is(err, ErrSecretFile) || !strings.Contains(err.Error(), "uid 65534") {
		t.Fatalf("another user's file: got %q, %v; want ErrSecretFile naming its owner", got, err)
	}
	if err := os.Chown(p, 0, 0); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadSecretFile(p); err != nil || string(got) != "s3cret" {
		t.Fatalf("root's file: got %q, %v", got, err)
	}
}
