package rendezvous

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestDialNameOnlyWhereStoresListen: a store address given as a name
// (MASTER_ADDR=localhost, or a host name with IPv4 and IPv6 addresses) is
// dialled at the address a store of that name listens on (its first IPv4
// address, as netaddr.ListenIP binds), not at whichever address the
// resolver gives first. A store binds one address: the port is free on
// the name's other addresses, where any user of the host may listen. The
// client dialled the name, which tried ::1 first, so that another user
// listening on [::1]:PORT got the rank's connection and, relaying it to
// the real store (the handshake passes through a relay untouched, as it
// would through any network path), read and could rewrite all that the
// rank sent and received.
//
// The client runs in a child process with a mount namespace of its own,
// whose /etc/hosts gives localhost ::1 first (as Debian's and Fedora's
// do); the impostor is this process, a relay on [::1] at the store's
// port.
func TestDialNameOnlyWhereStoresListen(t *testing.T) {
	const payload = "the-rank's-data-7f3a"
	a := Auth{Secret: []byte("s3cret"), Job: "dialname"}
	if port := os.Getenv("RDZV_DIALNAME_CHILD"); port != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := Dial(ctx, "localhost:"+port, a)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := c.Set(ctx, "k", []byte(payload)); err != nil {
			t.Fatal(err)
		}
		return
	}
	needHostsNamespace(t)
	srv, err := Listen("127.0.0.1:0", ServerConfig{Auth: a})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	port := strconv.Itoa(srv.Port())
	imp, err := net.Listen("tcp", "[::1]:"+port)
	if err != nil {
		t.Skipf("no IPv6 loopback to listen on: %v", err)
	}
	defer imp.Close()
	var mu sync.Mutex
	var relayed bytes.Buffer // what clients sent through the impostor
	accepted := 0
	go func() {
		for {
			c, err := imp.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			accepted++
			mu.Unlock()
			s, err := net.Dial("tcp", "127.0.0.1:"+port)
			if err != nil {
				c.Close()
				continue
			}
			go func() { io.Copy(c, s); c.Close() }()
			go func() {
				b := make([]byte, 4096)
				for {
					n, err := c.Read(b)
					mu.Lock()
					relayed.Write(b[:n])
					mu.Unlock()
					if _, werr := s.Write(b[:n]); err != nil || werr != nil {
						s.Close()
						return
					}
				}
			}()
		}
	}()
	runWithHosts(t, "::1 localhost\n127.0.0.1 localhost\n", "RDZV_DIALNAME_CHILD="+port)
	mu.Lock()
	defer mu.Unlock()
	if accepted > 0 || bytes.Contains(relayed.Bytes(), []byte(payload)) {
		t.Fatalf("the client dialled the impostor on [::1]:%s (%d connection(s)); it relayed %d bytes, the payload among them: %v",
			port, accepted, relayed.Len(), bytes.Contains(relayed.Bytes(), []byte(payload)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, srv.Addr().String(), a)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if v, err := c.Get(ctx, "k"); err != nil || string(v) != payload {
		t.Fatalf("the store holds %q, %v; want the client's payload", v, err)
	}
}

// TestDialManyAddressesSaysSo: a name of several addresses is dialled at
// its first IPv4 one alone (see above); where the store listens on
// another, Dial fails at its deadline saying which addresses the name has,
// which one it dialled, and to give the store's address instead.
func TestDialManyAddressesSaysSo(t *testing.T) {
	a := Auth{Secret: []byte("s3cret"), Job: "dialmany"}
	if port := os.Getenv("RDZV_DIALMANY_CHILD"); port != "" {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		c, err := Dial(ctx, "multi:"+port, a)
		if err == nil {
			c.Close()
			t.Fatal("Dial reached a store on the name's second address")
		}
		if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), "127.0.0.2") || !strings.Contains(err.Error(), "127.0.0.3") ||
			!strings.Contains(err.Error(), "give that address") {
			t.Fatalf("Dial: %v; want ErrUnreachable naming both addresses and what to do", err)
		}
		return
	}
	needHostsNamespace(t)
	srv, err := Listen("127.0.0.3:0", ServerConfig{Auth: a})
	if err != nil {
		t.Skipf("no 127.0.0.3 to listen on: %v", err)
	}
	defer srv.Close()
	runWithHosts(t, "127.0.0.2 multi\n127.0.0.3 multi\n", "RDZV_DIALMANY_CHILD="+strconv.Itoa(srv.Port()))
}

// needHostsNamespace skips t where no mount namespace with an /etc/hosts
// of its own can be made (not root, or no unshare).
func needHostsNamespace(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for a mount namespace with its own /etc/hosts")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("no unshare")
	}
}

// runWithHosts runs t's own test again in a child process, with env
// added, in a mount namespace whose /etc/hosts holds hosts; the child's
// failure is t's.
func runWithHosts(t *testing.T, hosts, env string) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(f, []byte(hosts), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c",
		`mount --bind "$1" /etc/hosts && exec "$2" -test.run="^$3\$" -test.count=1 -test.v`, "sh", f, os.Args[0], t.Name())
	cmd.Env = append(os.Environ(), env)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the client: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("the child did not run %s:\n%s", t.Name(), out)
	}
}
