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
