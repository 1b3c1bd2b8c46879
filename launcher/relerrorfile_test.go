package launcher

import (
	"errors"
	"testing"
)

// TestRelativeLogDirErrorFile: with a relative --log-dir, a worker that
// changes its directory before it fails (hydra's runs do, into their
// output directory) still writes its error file where the launcher reads
// it: TORCHELASTIC_ERROR_FILE is an absolute path, as torchrun's is.
func TestRelativeLogDirErrorFile(t *testing.T) {
	t.Chdir(t.TempDir())
	script := `mkdir -p outputs/run1 && cd outputs/run1 || exit 9
printf '{"message": {"message": "ValueError: boom", "extraInfo": {"timestamp": "1"}}}' > "$TORCHELASTIC_ERROR_FILE"
exit 3`
	out, _, err := run(t, Config{NProcPerNode: 1, LogDir: "logs", RunID: "rel"}, script)
	var je *JobError
	if !errors.As(err, &je) {
		t.Fatalf("err %v, want a JobError\n%s", err, out)
	}
	if je.First.ExitCode != 3 || je.First.Message != "ValueError: boom" {
		t.Errorf("first failure: %v; want exit code 3 with the error file's message %q\n%s", je.First, "ValueError: boom", out)
	}
}
