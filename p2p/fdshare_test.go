package p2p

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/testflood"
)

// TestFloodLeavesHostDescriptors: an endpoint shares its process's
// descriptors with the rest of it (its links, the collectives' transport
// and shared memory). Silent connections (no secret needed) that flood
// its port must not take them all: an endpoint whose process may open
// 1024 holds at most a share of them in handshakes, and the process,
// flooded, still opens the sockets it needs.
func TestFloodLeavesHostDescriptors(t *testing.T) {
	if os.Getenv("P2P_FDSHARE_CHILD") == "1" {
		t.Skip("the child runs TestFDShareChild")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestFDShareChild$")
	cmd.Env = append(os.Environ(), "P2P_FDSHARE_CHILD=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	r := bufio.NewReader(out)
	var addr string
	for addr == "" {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("the child gave no address: %v", err)
		}
		addr, _ = strings.CutPrefix(strings.TrimSpace(line), "ADDR ")
	}
	defer testflood.Silent(addr, 3000)() // more than the endpoint's process may open
	for {
		l, err := r.ReadString('\n')
		if s, ok := strings.CutPrefix(strings.TrimSpace(l), "FAIL "); ok {
			t.Error(s)
		} else if s, ok := strings.CutPrefix(strings.TrimSpace(l), "LOG "); ok {
			t.Log(s)
		}
		if err != nil {
			return
		}
	}
}

// TestFDShareChild is TestFloodLeavesHostDescriptors's endpoint, in a
// process that may open 1024 descriptors.
func TestFDShareChild(t *testing.T) {
	if os.Getenv("P2P_FDSHARE_CHILD") != "1" {
		t.Skip("run by TestFloodLeavesHostDescriptors")
	}
	say := func(format string, a ...any) { fmt.Fprintf(os.Stdout, format+"\n", a...) }
	lim := syscall.Rlimit{Cur: 1024, Max: 1024}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		say("FAIL setrlimit: %v", err)
		return
	}
	e, err := New(ctxT(t, 10*time.Second), Options{Name: "a", Auth: testAuth()})
	if err != nil {
		say("FAIL %v", err)
		return
	}
	defer e.Close()
	say("ADDR %s", e.Addr())
	time.Sleep(2 * time.Second) // the flood is on
	fails, tries := 0, 0
	var last error
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		tries++
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fails, last = fails+1, err
			continue
		}
		l.Close()
	}
	say("LOG %d of %d listens of the flooded endpoint's process failed", fails, tries)
	if fails > 0 {
		say("FAIL silent connections took the endpoint's process's descriptors: %d of %d listens failed (%v)", fails, tries, last)
	}
}
