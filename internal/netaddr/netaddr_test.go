package netaddr

import (
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// nonLoopback lists this host's up, non-loopback IPv4 addresses.
func nonLoopback(t *testing.T) []string {
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ifi := range ifs {
		if ifi.Flags&net.FlagUp == 0 || ifi.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := ifi.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() {
				out = append(out, ipn.IP.String())
			}
		}
	}
	return out
}

func TestListenIP(t *testing.T) {
	cases := []struct {
		ifname, master string
		spans          bool
		want           string
	}{
		{"", "127.0.0.1", false, "127.0.0.1"},
		{"", "127.0.1.1", false, "127.0.0.1"},
		{"lo", "127.0.0.1", true, "127.0.0.1"}, // the user's choice wins
		{"", "localhost", false, "127.0.0.1"},
		{"", "127.0.0.1", true, "127.0.0.1"}, // a loopback address given is meant
		{"", "127.0.1.1", true, "127.0.0.1"},
		// A name that is loopback on every host is meant as loopback
		// too: the other hosts (and this one's workers) dial their own.
		{"", "localhost", true, "127.0.0.1"},
	}
	for _, tc := range cases {
		got, err := ListenIP(tc.ifname, tc.master, tc.spans)
		if err != nil || got != tc.want {
			t.Errorf("ListenIP(%q, %q, %v) = %q, %v; want %q", tc.ifname, tc.master, tc.spans, got, err, tc.want)
		}
	}
	// A job across hosts whose master is a host name that is loopback
	// here (Debian maps a host's own name to 127.0.1.1) binds the host's
	// one other address, or asks which.
	host, _ := os.Hostname()
	if ips, err := net.LookupIP(host); err != nil || len(ips) == 0 || !ips[0].IsLoopback() || strings.EqualFold(host, "localhost") {
		t.Skipf("this host's name %q does not resolve to loopback (%v, %v)", host, ips, err)
	}
	others := nonLoopback(t)
	got, err := ListenIP("", host, true)
	switch len(others) {
	case 1:
		if err != nil || got != others[0] {
			t.Errorf("got %q, %v; want %s", got, err, others[0])
		}
	default:
		if !errors.Is(err, ErrNoListenAddr) {
			t.Errorf("with %d other addresses: got %q, %v; want ErrNoListenAddr", len(others), got, err)
		}
	}
}

// TestLoopbackName: names that are loopback on every host (RFC 6761's
// localhost and its subdomains, Debian's ip6 names), told apart without
// a lookup.
func TestLoopbackName(t *testing.T) {
	for name, want := range map[string]bool{
		"localhost": true, "LocalHost.": true, "a.localhost": true, "ip6-localhost": true, "ip6-loopback": true,
		"localhost.localdomain": true,
		"vm":                    false, "localhostx": false, "notlocalhost": false, "127.0.0.1": false, "": false,
	} {
		if got := loopbackName(name); got != want {
			t.Errorf("loopbackName(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestResolveUnknownIsFast(t *testing.T) {
	start := time.Now()
	_, err := ResolveIP("no-such-host.invalid")
	if !errors.Is(err, ErrUnresolvable) || time.Since(start) > ResolveTimeout+time.Second {
		t.Fatalf("%v after %v", err, time.Since(start))
	}
}
