package launcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/testbin"
)

// More than MaxWorkersPerCore workers per core are refused (nothing is
// started) unless forced; more than WarnWorkersPerCore per core warn.
func TestWorkersPerCore(t *testing.T) {
	defer func(f func() int) { numCPU = f }(numCPU)
	numCPU = func() int { return 1 }
	for _, tc := range []struct {
		n            int
		force        bool
		refuse, warn bool
	}{
		{WarnWorkersPerCore, false, false, false},
		{WarnWorkersPerCore + 1, false, false, true},
		{MaxWorkersPerCore, false, false, true},
		{MaxWorkersPerCore + 1, false, true, false},
		{MaxWorkersPerCore + 1, true, false, true},
	} {
		dir := t.TempDir()
		var mu sync.Mutex
		var warnings []string
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := Run(ctx, Config{Standalone: true, NProcPerNode: tc.n, Force: tc.force, Program: "sh",
			Args:  []string{"-c", "touch " + dir + "/ran.$RANK"},
			Warnf: func(f string, a ...any) { mu.Lock(); warnings = append(warnings, fmt.Sprintf(f, a...)); mu.Unlock() }})
		cancel()
		ran, _ := filepath.Glob(filepath.Join(dir, "ran.*"))
		name := fmt.Sprintf("%d workers on 1 core, force %v", tc.n, tc.force)
		if tc.refuse {
			if !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), "--force") || len(ran) != 0 {
				t.Errorf("%s: err %v, %d workers ran; want refused, none ran", name, err, len(ran))
			}
			continue
		}
		if err != nil || len(ran) != tc.n {
			t.Errorf("%s: err %v, %d workers ran", name, err, len(ran))
		}
		if warned := len(warnings) > 0 && strings.Contains(warnings[0], "per core"); warned != tc.warn {
			t.Errorf("%s: warnings %q, want a warning: %v", name, warnings, tc.warn)
		}
	}
}

func TestReadSecretFile(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, content string
		mode          os.FileMode
		want          string // "" : refused
		msg           string
	}{
		{"private", "s3cret\nignored\n", 0o600, "s3cret", ""},
		{"owner read-only, spaces", "  tok  \n", 0o400, "tok", ""},
		{"group-readable", "s3cret\n", 0o640, "", "chmod 600"},
		{"world-readable", "s3cret\n", 0o644, "", "chmod 600"},
		{"empty first line", "\ns3cret\n", 0o600, "", "no secret"},
	} {
		p := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_"))
		if err := os.WriteFile(p, []byte(tc.content), 0o600); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, tc.mode)
		got, err := ReadSecretFile(p)
		if tc.want != "" {
			if err != nil || string(got) != tc.want {
				t.Errorf("%s: %q, %v; want %q", tc.name, got, err, tc.want)
			}
			continue
		}
		if !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: err %v; want ErrBadConfig saying %q", tc.name, err, tc.msg)
		}
	}
	if _, err := ReadSecretFile(filepath.Join(dir, "missing")); !errors.Is(err, ErrBadConfig) {
		t.Errorf("a missing file: %v", err)
	}
}

// A job across nodes without a secret runs, with one warning that names
// the risk; with SLIME_JOB_SECRET in the environment it warns of nothing,
// and its workers get the secret.
func TestSecretAcrossNodes(t *testing.T) {
	for _, secret := range []string{"", "shared"} {
		port := testbin.FreePort(t)
		env := []string{"PATH=" + os.Getenv("PATH")}
		if secret != "" {
			env = append(env, "SLIME_JOB_SECRET="+secret)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		var warnMu sync.Mutex
		warnings := map[int][]string{}
		var outs [2]syncBuffer
		errs := make(chan error, 2)
		for node := range 2 {
			go func() {
				errs <- Run(ctx, Config{NNodes: 2, NodeRank: node, NProcPerNode: 1, MasterAddr: "127.0.0.1", MasterPort: port,
					RdzvTimeout: 30 * time.Second, Env: env, Program: "sh", Args: []string{"-c", `echo "S=$SLIME_JOB_SECRET"`},
					Stdout: &outs[node], Stderr: &outs[node],
					Warnf: func(f string, a ...any) {
						warnMu.Lock()
						warnings[node] = append(warnings[node], fmt.Sprintf(f, a...))
						warnMu.Unlock()
					}})
			}()
		}
		for range 2 {
			if err := <-errs; err != nil {
				t.Errorf("secret %q: %v", secret, err)
			}
		}
		cancel()
		for node := range 2 {
			w := warnings[node]
			if secret == "" && (len(w) != 1 || !strings.Contains(w[0], "anyone who can reach the store") || !strings.Contains(w[0], "read its data")) {
				t.Errorf("node %d without a secret warned %q; want one warning naming the risk", node, w)
			}
			if secret != "" && len(w) != 0 {
				t.Errorf("node %d with a secret warned %q", node, w)
			}
			if !strings.Contains(outs[node].String(), "S="+secret+"\n") {
				t.Errorf("node %d's worker got another secret:\n%s", node, outs[node].String())
			}
		}
	}
}
