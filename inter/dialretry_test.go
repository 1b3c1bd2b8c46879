package inter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slimego/slimego/internal/auth"
	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/rendezvous"
)

// TestDialRetriesTimeout: a dial whose SYN gets no answer (the peer's
// accept queue is full, and the kernel drops the SYN) runs out its
// one-second attempt with a timeout, which dialOne retries like a refused
// dial until the call's deadline; it is not a lost peer at the first try.
func TestDialRetriesTimeout(t *testing.T) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 0); err != nil { // a queue of one, never accepted
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*unix.SockaddrInet4).Port)
	c, err := net.DialTimeout("tcp", addr, time.Second) // fills the queue
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tr := &Transport{cfg: Config{Rank: 0, Auth: testKey, HandshakeTimeout: time.Second}}
	ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = tr.dialOne(ctx, 1, addr)
	if errors.Is(err, fault.ErrPeerLost) || !errors.Is(err, fault.ErrTimeout) {
		t.Fatalf("dialling a peer whose queue is full, after %v: %v, want the call's timeout", time.Since(start).Round(time.Millisecond), err)
	}
}

// closeOnRead is a connection whose first read closes it: an acceptor
// that says its hello and then drops the connection (as one evicting its
// oldest handshake, or closing the pending ones at its end, does).
type closeOnRead struct{ net.Conn }

func (c closeOnRead) Read([]byte) (int, error) { c.Conn.Close(); return 0, io.EOF }

// TestDialRetriesDroppedHandshake: a handshake that the acceptor drops
// after its hello (it was evicted, or the acceptor was closing) proves
// nothing against the acceptor: dialOne dials again, and the second
// handshake goes through. Only a refusal (ErrRefused: the acceptor
// answered, and its answer proves it is not of this job) is final.
func TestDialRetriesDroppedHandshake(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for i := 0; ; i++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if i == 0 {
				auth.Accept(closeOnRead{c}, testKey, shakePurpose("", 1, c.LocalAddr().String()), time.Now().Add(5*time.Second))
				continue
			}
			auth.Accept(c, testKey, shakePurpose("", 1, c.LocalAddr().String()), time.Now().Add(5*time.Second))
			defer c.Close()
		}
	}()
	tr := &Transport{cfg: Config{Rank: 0, Auth: testKey, HandshakeTimeout: 5 * time.Second}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tc, err := tr.dialOne(ctx, 1, ln.Addr().String())
	if err != nil {
		t.Fatalf("a handshake dropped after the acceptor's hello, then a good one: %v", err)
	}
	tc.Close()
}

// TestAddressWaitAborted: a rank that waits in the store for a peer's
// address when the job is aborted (the launcher saw that peer exit) fails
// with the store's abort, which says who and why, and not with a timeout
// that says the peer never published its address.
func TestAddressWaitAborted(t *testing.T) {
	st := testStore(t, 2)
	cfg := rankConfig(st[0], 0, testKey, 20*time.Second)
	res := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := st[1].Abort(ctx, "t/", 1, "rank 1 exited with status 3"); err != nil {
		t.Fatal(err)
	}
	s := await(t, res, 10*time.Second)
	var ae *rendezvous.AbortError
	if !errors.As(s.err, &ae) || ae.Rank != 1 || errors.Is(s.err, fault.ErrTimeout) {
		t.Fatalf("New while the job was aborted: %v, want the store's abort by rank 1", s.err)
	}
}
