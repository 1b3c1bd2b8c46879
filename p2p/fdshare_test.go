package p2p

import (
	"bufio"
	"encoding/hex"
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
// 1024 holds at most three quarters of them in handshakes, and the
// process, flooded, still opens the sockets it needs; a member still links
// to it.
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
	var addr, info string
	for addr == "" || info == "" {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("the child gave no address: %v", err)
		}
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, "ADDR "); ok {
			addr = v
		} else if v, ok := strings.CutPrefix(line, "INFO "); ok {
			info = v
		}
	}
	defer testflood.Silent(addr, 3000)() // more than the endpoint's process may open
	time.Sleep(time.Second)              // the flood is on
	m := endpoint(t, ctxT(t, 5*time.Second), Options{Name: "m", Auth: testAuth(), Channels: 2})
	in, err := hex.DecodeString(info)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if _, err := m.ConnectInfo(ctxT(t, 20*time.Second), in); err != nil {
		t.Errorf("a member cannot link to the flooded endpoint (after %v): %v", time.Since(t0).Round(time.Millisecond), err)
	} else {
		t.Logf("a member linked to the flooded endpoint in %v", time.Since(t0).Round(time.Millisecond))
	}
	for {
		l, err := r.ReadString('\n')
		if s, ok := strings.CutPrefix(strings.TrimSpace(l), "FAIL "); ok {
			t.Error(s)
		} else if s, ok := strings.CutPrefix(strings.TrimSpace(l), "LOG "); ok {
			t.Log(s)
		}
		if err != nil || strings.TrimSpace(l) == "DONE" {
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
	say("INFO %s", hex.EncodeToString(e.Info()))
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
	say("DONE")
	time.Sleep(time.Minute) // serving, until the parent ends it
}
