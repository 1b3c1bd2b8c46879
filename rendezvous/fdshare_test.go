package rendezvous

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

// TestFloodLeavesHostDescriptors: a store shares its process's
// descriptors with the rest of it (rank 0's transport, its shared memory,
// slimerun's workers' pipes). Silent connections (no secret needed) that
// flood it must not take them all: a store whose process may open 1024
// holds at most three quarters of them, and the process, flooded, still
// opens the sockets it needs; a member still joins.
func TestFloodLeavesHostDescriptors(t *testing.T) {
	if os.Getenv("RDZV_FDSHARE_CHILD") == "1" {
		t.Skip("the child runs TestFDShareChild")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestFDShareChild$")
	cmd.Env = append(os.Environ(), "RDZV_FDSHARE_CHILD=1")
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
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimSpace(strings.TrimPrefix(line, "ADDR "))
	defer testflood.Silent(addr, 3000)() // more than the store's process may open
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

// TestFDShareChild is TestFloodLeavesHostDescriptors's store, in a process
// that may open 1024 descriptors.
func TestFDShareChild(t *testing.T) {
	if os.Getenv("RDZV_FDSHARE_CHILD") != "1" {
		t.Skip("run by TestFloodLeavesHostDescriptors")
	}
	say := func(format string, a ...any) { fmt.Fprintf(os.Stdout, format+"\n", a...) }
	lim := syscall.Rlimit{Cur: 1024, Max: 1024}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		say("FAIL setrlimit: %v", err)
		return
	}
	a := Auth{Secret: []byte("s3cret"), Job: "job"}
	s, err := Listen("127.0.0.1:0", ServerConfig{Auth: a})
	if err != nil {
		say("FAIL %v", err)
		return
	}
	defer s.Close()
	say("ADDR %s", s.Addr())
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
	s.mu.Lock()
	held := len(s.conns)
	s.mu.Unlock()
	say("LOG the store held %d connections; %d of %d listens of its process failed", held, fails, tries)
	if fails > 0 {
		say("FAIL silent connections took the store's process's descriptors: %d of %d listens failed (%v)", fails, tries, last)
	}
	cl, err := Dial(ctxT(t, 10*time.Second), s.Addr().String(), a)
	if err != nil {
		say("FAIL a member cannot join the flooded store: %v", err)
		return
	}
	cl.Close()
}
