package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestTCPZeroBytes: a transfer of 0 bytes (-b 0) is a row of its own,
// with its duplex column, not a second "one-way latency": only the
// 8-byte ping-pong is the latency (a transfer's bandwidth of 0 made any
// row look like it).
func TestTCPZeroBytes(t *testing.T) {
	bin := slimebench(t)
	out, code := run(t, filepath.Join(filepath.Dir(bin), "slimerun"), "-q", "--standalone", "--nproc-per-node", "2", bin,
		"tcp", "-b", "0", "-e", "0", "--channels", "1", "--lowat", "0")
	if code != 0 || crashed(out) {
		t.Fatalf("exit %d, want 0:\n%s", code, out)
	}
	var latency, zero []string
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(strings.TrimPrefix(l, "[0]: "))
		if len(f) < 5 || strings.HasPrefix(f[0], "#") {
			continue
		}
		if strings.Contains(l, "one-way latency") {
			latency = append(latency, l)
		}
		if f[0] == "0" {
			zero = append(zero, strings.Join(f[:3], " "))
		}
	}
	if len(latency) != 1 || !strings.Contains(latency[0], " 8 ") {
		t.Errorf("latency rows %q, want the 8-byte ping-pong's alone:\n%s", latency, out)
	}
	if strings.Join(zero, ",") != "0 1 false,0 1 true" {
		t.Errorf("0-byte rows %q, want one way and duplex (size channels duplex):\n%s", zero, out)
	}
}

// TestTCPCSVRows: every CSV row of slimebench tcp names what it measured:
// the ping-pong's one-way latency and an 8-byte transfer were both
// "tcp-1" at S 8, one row indistinguishable from the other (and compare,
// which matches by P, size and placement, took whichever came first).
func TestTCPCSVRows(t *testing.T) {
	bin := slimebench(t)
	out, code := run(t, filepath.Join(filepath.Dir(bin), "slimerun"), "-q", "--standalone", "--nproc-per-node", "2", bin,
		"tcp", "-b", "8", "-e", "8", "--channels", "1", "--lowat", "0", "--csv")
	if code != 0 || crashed(out) {
		t.Fatalf("exit %d, want 0:\n%s", code, out)
	}
	seen := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Split(strings.TrimPrefix(l, "[0]: "), ",")
		if len(f) != 10 || f[0] == "impl" {
			continue
		}
		key := f[0] + " P=" + f[3] + " S=" + f[5]
		if seen[key] {
			t.Errorf("two rows of %s:\n%s", key, out)
		}
		seen[key] = true
	}
	if len(seen) != 3 {
		t.Errorf("%d distinct rows, want 3 (latency, one way, duplex):\n%s", len(seen), out)
	}
}
