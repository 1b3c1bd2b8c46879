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
	"github.com/slimego/slimego/rendezvous"
)

// TestFloodOfTwoListenersLeavesDescriptors: a process that hosts the
// store and an endpoint (rank 0 of a job that uses p2p), both flooded
// with silent connections, keeps descriptors for the rest of it: the two
// listeners draw from one share (machine.TakeUnproven). Each took three
// quarters of the process's descriptors of its own, one and a half in
// all: 215 of 276 listens of the process failed (too many open files).
func TestFloodOfTwoListenersLeavesDescriptors(t *testing.T) {
	if os.Getenv("P2P_TWOFLOOD_CHILD") == "1" {
		t.Skip("the child runs TestTwoFloodChild")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestTwoFloodChild$")
	cmd.Env = append(os.Environ(), "P2P_TWOFLOOD_CHILD=1")
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
	var ep, sp string
	for ep == "" || sp == "" {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, "EP "); ok {
			ep = v
		} else if v, ok := strings.CutPrefix(line, "ST "); ok {
			sp = v
		}
	}
	defer testflood.Silent(ep, 3000)()
	defer testflood.Silent(sp, 3000)()
	for {
		l, err := r.ReadString('\n')
		if l != "" {
			t.Log(strings.TrimSpace(l))
		}
		if strings.HasPrefix(l, "FAIL") {
			t.Error(l)
		}
		if err != nil || strings.TrimSpace(l) == "DONE" {
			return
		}
	}
}

// TestTwoFloodChild hosts TestFloodOfTwoListenersLeavesDescriptors's
// store and endpoint in a process that may open 1024 descriptors, and
// says how many listens of its own failed under the flood.
func TestTwoFloodChild(t *testing.T) {
	if os.Getenv("P2P_TWOFLOOD_CHILD") != "1" {
		t.Skip("run by TestFloodOfTwoListenersLeavesDescriptors")
	}
	say := func(format string, a ...any) { fmt.Fprintf(os.Stdout, format+"\n", a...) }
	lim := syscall.Rlimit{Cur: 1024, Max: 1024}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		say("FAIL %v", err)
		return
	}
	s, err := rendezvous.Listen("127.0.0.1:0", rendezvous.ServerConfig{Auth: testAuth()})
	if err != nil {
		say("FAIL %v", err)
		return
	}
	defer s.Close()
	e, err := New(ctxT(t, 10*time.Second), Options{Name: "a", Auth: testAuth()})
	if err != nil {
		say("FAIL %v", err)
		return
	}
	defer e.Close()
	say("EP %s", e.Addr())
	say("ST %s", s.Addr())
	time.Sleep(3 * time.Second)
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
	n, _ := os.ReadDir("/proc/self/fd")
	say("LOG %d of %d listens failed (%v); fds open %d", fails, tries, last, len(n))
	if fails > 0 {
		say("FAIL store+endpoint flood took the process's descriptors")
	}
	say("DONE")
	time.Sleep(time.Minute)
}
