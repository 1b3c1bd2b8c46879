package auth

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestPeerUIDFindsOwnSockets: both ends of a loopback connection find the
// other's socket, and its owner is this user; over IPv4, IPv6, and IPv4 to
// a dual-stack listener (whose table is tcp6, the connector's tcp). The
// check of the user depends on it: a socket not found is admitted.
func TestPeerUIDFindsOwnSockets(t *testing.T) {
	for _, tc := range []struct{ network, listen, dial string }{
		{"tcp4", "127.0.0.1:0", "127.0.0.1"},
		{"tcp6", "[::1]:0", "::1"},
		{"tcp", "[::]:0", "127.0.0.1"},
	} {
		t.Run(tc.listen+"<-"+tc.dial, func(t *testing.T) {
			a, c := loopback(t, tc.network, tc.listen, tc.dial)
			me := uint32(os.Geteuid())
			for _, end := range []net.Conn{a, c} {
				if uid, found, gone := peerUID(end); !found || gone || uid != me {
					t.Errorf("%s -> %s: peerUID = %d, %t; want %d, found", end.LocalAddr(), end.RemoteAddr(), uid, found, me)
				}
			}
		})
	}
}

// The child of TestNoSecretOtherUserRefused, run as another user: it
// connects to (or accepts on) the address given and runs the handshake of
// a key without a secret, and writes the result to stdout.
func TestOtherUserChild(t *testing.T) {
	role, addr := os.Getenv("AUTH_CHILD_ROLE"), os.Getenv("AUTH_CHILD_ADDR")
	if role == "" {
		t.Skip("the child of TestNoSecretOtherUserRefused")
	}
	k := NewKey(nil, "job")
	deadline := time.Now().Add(5 * time.Second)
	var err error
	switch role {
	case "connect":
		var c net.Conn
		if c, err = net.Dial("tcp", addr); err == nil {
			err = Connect(c, k, "store", deadline)
			c.Close()
		}
	case "self":
		// TestPeerUIDFindsOwnSockets as this user: not root, whose
		// sockets are many (an answer of uid 0 proves little).
		var ln net.Listener
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err == nil {
			var c net.Conn
			if c, err = net.Dial("tcp", ln.Addr().String()); err == nil {
				var a net.Conn
				if a, err = ln.Accept(); err == nil {
					for _, end := range []net.Conn{a, c} {
						if uid, found, gone := peerUID(end); !found || gone || uid != uint32(os.Geteuid()) {
							err = fmt.Errorf("%s -> %s: peerUID = %d, %t; want %d, found", end.LocalAddr(), end.RemoteAddr(), uid, found, os.Geteuid())
						}
					}
					a.Close()
				}
				c.Close()
			}
			ln.Close()
		}
	case "accept":
		var ln net.Listener
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err == nil {
			os.WriteFile(addr, []byte(ln.Addr().String()), 0o644)
			var c net.Conn
			if c, err = ln.Accept(); err == nil {
				err = Accept(c, k, "store", deadline)
				c.Close()
			}
		}
	}
	os.Stdout.WriteString("CHILD: refused=" + strconv.FormatBool(errors.Is(err, ErrRefused)) + " notuser=" + strconv.FormatBool(errors.Is(err, ErrNotUser)) + " " + errString(err) + "\n")
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// TestNoSecretOtherUserRefused: a job with no secret on one host admits
// only its own user's processes. Another user's process (uid 65534) that
// knows the job id connected to the store and was admitted (the exchange
// proves nothing without a secret), and a listener of theirs at the
// address a rank dialled was taken for the job's. Now both are refused,
// with ErrRefused naming the uid, before the refusing side sends anything.
func TestNoSecretOtherUserRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a process as another user")
	}
	// The test binary, where uid 65534 may run it.
	dir := t.TempDir()
	for d := dir; d != "/tmp" && d != "/"; d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	bin := filepath.Join(dir, "auth.test")
	src, err := os.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	dst, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	src.Close()
	dst.Close()
	child := func(role, addr string) *exec.Cmd {
		cmd := exec.Command(bin, "-test.run=^TestOtherUserChild$", "-test.v")
		cmd.Env = append(os.Environ(), "AUTH_CHILD_ROLE="+role, "AUTH_CHILD_ADDR="+addr)
		cmd.Dir = dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		return cmd
	}
	k := NewKey(nil, "job")

	t.Run("own sockets, not root", func(t *testing.T) {
		out, err := child("self", "").Output()
		if err != nil || !strings.Contains(string(out), "CHILD: refused=false notuser=false <nil>") {
			t.Fatalf("%v:\n%s", err, out)
		}
	})
	t.Run("connector", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		cmd := child("connect", ln.Addr().String())
		var out strings.Builder
		cmd.Stdout = &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		ln.(*net.TCPListener).SetDeadline(time.Now().Add(10 * time.Second))
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		err = Accept(c, k, "store", time.Now().Add(5*time.Second))
		if !errors.Is(err, ErrRefused) || !errors.Is(err, ErrNotUser) || !strings.Contains(err.Error(), "uid 65534") {
			t.Fatalf("Accept of uid 65534's connection: %v; want ErrRefused naming uid 65534", err)
		}
		c.Close()
		cmd.Wait()
		// The connector is told why, as a refusal (not a dropped
		// connection, which callers retry until their deadline).
		if got := out.String(); !strings.Contains(got, "CHILD: refused=true notuser=true") || !strings.Contains(got, "admits on its host only its own user's processes") {
			t.Fatalf("the connector's result:\n%s\nwant ErrRefused saying why", got)
		}
	})
	t.Run("acceptor", func(t *testing.T) {
		out := filepath.Join(dir, "out")
		if err := os.Mkdir(out, 0o777); err != nil {
			t.Fatal(err)
		}
		os.Chmod(out, 0o777) // the child's to write in
		addrFile := filepath.Join(out, "addr")
		cmd := child("accept", addrFile)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { cmd.Process.Kill(); cmd.Wait() }()
		var addr []byte
		for end := time.Now().Add(10 * time.Second); len(addr) == 0; {
			if time.Now().After(end) {
				t.Fatal("the child never listened")
			}
			time.Sleep(10 * time.Millisecond)
			addr, _ = os.ReadFile(addrFile)
		}
		c, err := net.Dial("tcp", string(addr))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		err = Connect(c, k, "store", time.Now().Add(5*time.Second))
		if !errors.Is(err, ErrRefused) || !errors.Is(err, ErrNotUser) || !strings.Contains(err.Error(), "uid 65534") {
			t.Fatalf("Connect to uid 65534's listener: %v; want ErrRefused naming uid 65534", err)
		}
	})
}

// fakeAddrs is a connection that says it has other addresses than its
// own: the lookup of a peer that is not on this host.
type fakeAddrs struct {
	net.Conn
	local, remote net.Addr
}

func (f fakeAddrs) LocalAddr() net.Addr  { return f.local }
func (f fakeAddrs) RemoteAddr() net.Addr { return f.remote }

// TestPeerUIDNotAListener: a peer on another host has no socket in this
// host's table, and the kernel's lookup of one connection falls back to a
// listener on its port (bound to every address): that listener's owner,
// any user of this host's, was taken for the peer's, and the peer refused
// as that user's. Only the connection asked for is an answer now.
func TestPeerUIDNotAListener(t *testing.T) {
	ln, err := net.Listen("tcp", "[::]:0") // a listener on every address, of this user's
	if err != nil {
		t.Skipf("no dual-stack listener: %v", err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	for _, remote := range []string{"10.99.0.2", "127.0.0.1"} {
		f := fakeAddrs{
			local:  &net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 40000},
			remote: &net.TCPAddr{IP: net.ParseIP(remote), Port: port},
		}
		if uid, found, gone := peerUID(f); found || gone {
			t.Errorf("a peer at %s:%d, no connection of this host's: peerUID = %d, found %t, gone %t; want not found", remote, port, uid, found, gone)
		}
	}
}

// TestPeerUIDClosed: a peer that closed its end (its socket orphaned:
// FIN_WAIT2 or TIME_WAIT, which the kernel lists as uid 0) is gone, not
// root's: admitted as root, another user could send its requests and
// close before its owner was checked.
func TestPeerUIDClosed(t *testing.T) {
	a, c := loopback(t, "tcp4", "127.0.0.1:0", "127.0.0.1")
	c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		uid, found, gone := peerUID(a)
		if gone {
			return
		}
		if found && uid == 0 && os.Geteuid() != 0 {
			t.Fatalf("the closed connector's socket reads as root's")
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after the connector closed: peerUID = %d, found %t, gone %t; want gone", uid, found, gone)
		}
		time.Sleep(20 * time.Millisecond) // as root, uid 0 is this user's too: wait for the orphan
	}
}

// TestProcLookup: the tables' reading, where sock_diag cannot be asked,
// finds both ends of a loopback connection as this user's, and a listener
// on the port of a peer not on this host as no one's.
func TestProcLookup(t *testing.T) {
	a, c := loopback(t, "tcp4", "127.0.0.1:0", "127.0.0.1")
	for _, end := range []net.Conn{a, c} {
		uid, found, gone := procLookup(end.RemoteAddr().(*net.TCPAddr), end.LocalAddr().(*net.TCPAddr))
		if !found || gone || uid != uint32(os.Geteuid()) {
			t.Errorf("%s -> %s: procLookup = %d, found %t, gone %t; want this user's", end.LocalAddr(), end.RemoteAddr(), uid, found, gone)
		}
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0") // a listener, which is no connection
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	if _, found, _ := procLookup(&net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: port}, &net.TCPAddr{IP: net.ParseIP("10.99.0.2"), Port: 40000}); found {
		t.Error("a listener was taken for a connection")
	}
}

// loopback is a connection on this host: a listener on listen (network),
// dialled at dial, and both ends, closed when t ends; it skips t where the
// host has no such address.
func loopback(t *testing.T, network, listen, dial string) (accepted, dialled net.Conn) {
	t.Helper()
	ln, err := net.Listen(network, listen)
	if err != nil {
		t.Skipf("no %s: %v", listen, err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", net.JoinHostPort(dial, strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)))
	if err != nil {
		t.Skipf("dial %s: %v", dial, err)
	}
	t.Cleanup(func() { c.Close() })
	a, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a, c
}
