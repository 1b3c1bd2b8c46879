package rendezvous

import (
	"bufio"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/testflood"
)

// TestFloodAtDescriptorLimit: a store whose process has fewer descriptors
// than MaxConns (a host's `ulimit -n`), flooded without end by silent
// connections (no secret needed), still lets a member in: out of
// descriptors, it closes the oldest silent connection, as it does at
// MaxConns.
func TestFloodAtDescriptorLimit(t *testing.T) {
	if os.Getenv("RDZV_EMFILE_CHILD") == "1" {
		t.Skip("the child runs in TestMain-less mode below")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestEMFILEChild$")
	cmd.Env = append(os.Environ(), "RDZV_EMFILE_CHILD=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimSpace(strings.TrimPrefix(line, "ADDR "))
	// The flood: always more silent connections than the store's descriptors.
	defer testflood.Silent(addr, 2000)()
	time.Sleep(time.Second)
	cl, err := Dial(ctxT(t, 10*time.Second), addr, Auth{Secret: []byte("s3cret"), Job: "job"})
	if err != nil {
		t.Fatalf("a member cannot reach a store flooded to its descriptor limit: %v", err)
	}
	cl.Close()
}

// TestEMFILEChild is TestFloodAtDescriptorLimit's store: 256 descriptors.
func TestEMFILEChild(t *testing.T) {
	if os.Getenv("RDZV_EMFILE_CHILD") != "1" {
		t.Skip("run by TestFloodAtDescriptorLimit")
	}
	lim := syscall.Rlimit{Cur: 256, Max: 256}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	s, err := Listen("127.0.0.1:0", ServerConfig{Auth: Auth{Secret: []byte("s3cret"), Job: "job"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	os.Stdout.WriteString("ADDR " + s.Addr().String() + "\n")
	time.Sleep(30 * time.Second)
}
