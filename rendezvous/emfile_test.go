package rendezvous

import (
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// TestAcceptSurvivesEMFILE: a moment out of descriptors (a flood of
// connections, anyone's) must not end the store's accept loop: once
// descriptors are free again, a member joins.
func TestAcceptSurvivesEMFILE(t *testing.T) {
	a := Auth{Secret: []byte("s3cret"), Job: "job"}
	s, _ := startCfg(t, ServerConfig{Auth: a})
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	lim := old
	lim.Cur = 256
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Skip(err)
	}
	var fill []*os.File
	release := func() {
		for _, f := range fill {
			f.Close()
		}
		fill = nil
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old)
	}
	defer release()
	for {
		f, err := os.Open("/dev/null")
		if err != nil {
			if !errors.Is(err, syscall.EMFILE) {
				t.Fatal(err)
			}
			break
		}
		fill = append(fill, f)
	}
	// One descriptor free: the attacker's socket takes it, so the server's
	// accept finds none.
	fill[len(fill)-1].Close()
	fill = fill[:len(fill)-1]
	c, err := net.DialTimeout("tcp", s.Addr().String(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the accept loop meets EMFILE
	c.Close()
	release()
	cl, err := Dial(ctxT(t, 3*time.Second), s.Addr().String(), a)
	if err != nil {
		t.Fatalf("after a moment out of descriptors the store accepts no member: %v", err)
	}
	cl.Close()
}
