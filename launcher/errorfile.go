package launcher

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"unicode"
	"unicode/utf8"
)

// Error files, as torchrun's: every worker is given TORCHELASTIC_ERROR_FILE,
// a path of its own, where a program whose entry point torch's @record
// wraps (torch.distributed.elastic.multiprocessing.errors) writes the
// exception that ended it, as JSON:
//
//	{"message": {"message": "RuntimeError: ...", "extraInfo": {"py_callstack": "...", "timestamp": "..."}}}
//
// A failed worker's message then goes into its WorkerError, and so into
// what slimerun prints. The file is the worker's to write, so nothing in it
// is trusted: it is opened without following a link and without blocking
// (a FIFO there would hold the launcher), read only where it is a regular
// file, at most maxErrorFile bytes of it, and the message is cut to
// maxErrorMessage bytes of printable text.

const (
	maxErrorFile    = 1 << 20
	maxErrorMessage = 4 << 10
	// errorsDirPrefix names the job's temporary directory of error files.
	errorsDirPrefix = "slimerun-errors-"
)

// errorFile is the error file of local rank local in attempt, under the
// log directory where one was given (torchrun's layout, kept with the
// logs), else under the job's own temporary directory (removed when Run
// returns, or by the guard if the launcher is killed); "" where neither
// could be made (no file is given then).
func (j *job) errorFile(attempt, local int) string {
	base := j.cfg.LogDir
	if base == "" {
		if j.errDir == "" {
			d, err := os.MkdirTemp("", errorsDirPrefix)
			if err != nil {
				j.cfg.Logf("no error files for the workers: %v", err)
				return ""
			}
			j.errDir = d
			j.guard.removeDir(d) // if the launcher is killed
		}
		base = j.errDir
	}
	dir := filepath.Join(j.cfg.logRoot(base), "attempt_"+strconv.Itoa(attempt), strconv.Itoa(local))
	if err := mkdirSecure(dir, 0o700); err != nil {
		j.cfg.Warnf("no error file for local rank %d: %v", local, err)
		return ""
	}
	f := filepath.Join(dir, "error.json")
	os.Remove(f) // an earlier run's, under a log directory given again
	return f
}

// readErrorFile returns the message a worker wrote to its error file
// (see above), or "" where there is none to be had.
func readErrorFile(path string) string {
	if path == "" {
		return ""
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return ""
	}
	b, err := io.ReadAll(io.LimitReader(f, maxErrorFile+1))
	if err != nil || len(b) > maxErrorFile {
		return ""
	}
	return parseErrorFile(b)
}

// parseErrorFile is the message of an error file's bytes: "message" is
// an object whose "message" is the text (what @record writes), or the
// text itself; "" where it is neither.
func parseErrorFile(b []byte) string {
	var doc struct {
		Message json.RawMessage `json:"message"`
	}
	if json.Unmarshal(b, &doc) != nil || len(doc.Message) == 0 {
		return ""
	}
	var msg string
	if json.Unmarshal(doc.Message, &msg) != nil {
		var inner struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(doc.Message, &inner) != nil {
			return ""
		}
		msg = inner.Message
	}
	return printable(msg, maxErrorMessage)
}

// printable is s with every control character but newline and tab as a
// space, trimmed, and cut to at most n bytes (on a character's boundary).
func printable(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if r == '\n' || r == '\t' || !unicode.IsControl(r) && r != utf8.RuneError {
			return r
		}
		return ' '
	}, s)
	s = strings.TrimSpace(s)
	if len(s) > n {
		s = s[:n]
		for len(s) > 0 && !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
		s += " …"
	}
	return s
}
