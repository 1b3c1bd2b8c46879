package collective

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLoadEnvSecretFile: SLIME_JOB_SECRET_FILE is held to the launcher's
// rules under any launcher: a file its group or others can read is
// refused, not silently used.
func TestLoadEnvSecretFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	loose := filepath.Join(dir, "loose")
	os.WriteFile(good, []byte("s3cret\n"), 0o600)
	os.WriteFile(loose, []byte("s3cret\n"), 0o600)
	os.Chmod(loose, 0o644)
	o, err := LoadEnv(func(k string) string { return map[string]string{"SLIME_JOB_SECRET_FILE": good}[k] })
	if err != nil || string(o.JobSecret) != "s3cret" {
		t.Fatalf("good file: %q, %v", o.JobSecret, err)
	}
	o, err = LoadEnv(func(k string) string {
		return map[string]string{"SLIME_JOB_SECRET": "env", "SLIME_JOB_SECRET_FILE": good}[k]
	})
	if err != nil || string(o.JobSecret) != "env" {
		t.Fatalf("SLIME_JOB_SECRET must win: %q, %v", o.JobSecret, err)
	}
	_, err = LoadEnv(func(k string) string { return map[string]string{"SLIME_JOB_SECRET_FILE": loose}[k] })
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "mode 0644") {
		t.Fatalf("loose file: %v, want ErrInvalid naming the mode", err)
	}
}
