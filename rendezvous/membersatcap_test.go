package rendezvous

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestMembersBeyondDescriptorShare: members that have proven themselves do
// not count against the share of descriptors kept for connections from
// anyone (three quarters of the process's): a store whose process may
// open 1024 descriptors serves 850 members. Counting every connection,
// it took 768 and left the others to time out, with no word why.
func TestMembersBeyondDescriptorShare(t *testing.T) {
	if os.Getenv("RDZV_SHARE_CHILD") == "1" {
		t.Skip("the child runs TestMembersShareChild")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestMembersShareChild$")
	cmd.Env = append(os.Environ(), "RDZV_SHARE_CHILD=1")
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
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "ADDR ")
	if err != nil || !ok {
		t.Fatalf("the child gave no address: %q, %v", line, err)
	}
	a := Auth{Secret: []byte("s3cret"), Job: "job"}
	const members = 850
	var wg sync.WaitGroup
	var mu sync.Mutex
	var cls []*Client
	var failed []error
	sem := make(chan struct{}, 64) // dial in waves: a member waits for the store, not for the processors
	for range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cl, err := Dial(ctx, addr, a)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed = append(failed, err)
				return
			}
			cls = append(cls, cl)
		}()
	}
	wg.Wait()
	for _, c := range cls {
		c.Close()
	}
	if len(failed) > 0 {
		t.Fatalf("%d of %d members got in; %d failed, the first: %v", len(cls), members, len(failed), failed[0])
	}
}

// TestMembersShareChild hosts the store of TestMembersBeyondDescriptorShare
// in a process that may open 1024 descriptors.
func TestMembersShareChild(t *testing.T) {
	if os.Getenv("RDZV_SHARE_CHILD") != "1" {
		t.Skip("run by TestMembersBeyondDescriptorShare")
	}
	lim := syscall.Rlimit{Cur: 1024, Max: 1024}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	s, err := Listen("127.0.0.1:0", ServerConfig{Auth: Auth{Secret: []byte("s3cret"), Job: "job"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	os.Stdout.WriteString("ADDR " + s.Addr().String() + "\n")
	time.Sleep(2 * time.Minute) // killed by the parent
}
