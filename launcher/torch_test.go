package launcher

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/testbin"
)

// needTorch skips the test where Debian's python3-torch is missing, unless
// SLIME_REQUIRE_TORCH=1 (CI installs it) makes that a failure.
func needTorch(t *testing.T) string {
	t.Helper()
	const py = "/usr/bin/python3"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, py, "-c", "import torch.distributed").CombinedOutput(); err != nil {
		if os.Getenv("SLIME_REQUIRE_TORCH") == "1" {
			t.Fatalf("SLIME_REQUIRE_TORCH=1 but %s cannot import torch: %v\n%s", py, err, out)
		}
		t.Skipf("no torch for %s: %v", py, err)
	}
	return py
}

func torchScript(t *testing.T) string {
	p, err := filepath.Abs("testdata/torch_allgather.py")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// An unmodified torch program (gloo, init_method="env://") runs under a
// standalone launcher: rank 0 binds MASTER_PORT for torch's own store, which
// the launcher's store must therefore leave free.
func TestTorchStandalone(t *testing.T) {
	py := needTorch(t)
	var out, errb syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	err := Run(ctx, Config{Standalone: true, NProcPerNode: 4, StopGrace: 2 * time.Second,
		Program: py, Args: []string{torchScript(t), "7"}, Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatalf("%v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errb.String())
	}
	for r := range 4 {
		if !strings.Contains(out.String(), "PASS rank "+string(rune('0'+r))) {
			t.Errorf("no PASS from rank %d:\n%s\n%s", r, out.String(), errb.String())
		}
	}
}

// The same torch program across two launchers on loopback (two nodes of
// two workers), both given the job's secret: node 1 learns the workers'
// MASTER_PORT from node 0's store.
func TestTorchTwoNodes(t *testing.T) {
	py := needTorch(t)
	port := testbin.FreePort(t)
	env := append(os.Environ(), "SLIME_JOB_SECRET=torch-two-nodes")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var outs [2]syncBuffer
	errs := make(chan error, 2)
	for node := range 2 {
		go func() {
			errs <- Run(ctx, Config{NNodes: 2, NodeRank: node, NProcPerNode: 2, MasterAddr: "127.0.0.1", MasterPort: port,
				StopGrace: 2 * time.Second, RdzvTimeout: time.Minute, Env: env,
				Program: py, Args: []string{torchScript(t), "11"}, Stdout: &outs[node], Stderr: &outs[node]})
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("%v", err)
		}
	}
	all := outs[0].String() + outs[1].String()
	for r := range 4 {
		if !strings.Contains(all, "PASS rank "+strconv.Itoa(r)) {
			t.Errorf("no PASS from rank %d", r)
		}
	}
	if t.Failed() {
		t.Logf("node 0:\n%s\nnode 1:\n%s", outs[0].String(), outs[1].String())
	}
}

// A torch program whose entry point @record wraps writes the exception
// that ended a worker to its TORCHELASTIC_ERROR_FILE: the job's error
// carries it.
func TestTorchRecord(t *testing.T) {
	py := needTorch(t)
	script, err := filepath.Abs("testdata/torch_record.py")
	if err != nil {
		t.Fatal(err)
	}
	var out syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	err = Run(ctx, Config{Standalone: true, NProcPerNode: 2, StopGrace: 2 * time.Second,
		Program: py, Args: []string{script}, Stdout: &out, Stderr: &out})
	var je *JobError
	if !errors.As(err, &je) || je.First.Rank != 1 || !strings.HasPrefix(je.First.Message, "ValueError: rank 1 gives up") {
		t.Fatalf("err %v, want rank 1's ValueError from its error file\n%s", err, out.String())
	}
	t.Logf("%v", err)
}
