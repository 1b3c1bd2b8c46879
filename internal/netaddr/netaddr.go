// Package netaddr picks the addresses a job listens on: the one that
// reaches the master (the interface a multi-node store and every transport
// bind, never all of them), and loopback for a job on one host.
package netaddr

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
)

// ErrUnresolvable: a host name does not resolve. It is final: retrying
// would only wait out the caller's deadline.
var ErrUnresolvable = errors.New("netaddr: host does not resolve")

// ResolveTimeout bounds one name look-up.
const ResolveTimeout = 2 * time.Second

// ResolveIP returns host's first IPv4 address (or its IPv6 one where it has
// no IPv4), looking names up for at most ResolveTimeout.
func ResolveIP(host string) (net.IP, error) {
	if ip := net.ParseIP(host); ip != nil {
		return ip, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), ResolveTimeout)
	defer cancel()
	ips, err := net.DefaultResolver.LookupIP(ctx, "ip", host)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrUnresolvable, host, err)
	}
	if len(ips) == 0 {
		return nil, fmt.Errorf("%w: %s: no address", ErrUnresolvable, host)
	}
	for _, ip := range ips {
		if ip.To4() != nil {
			return ip, nil
		}
	}
	return ips[0], nil
}

// IsLoopback reports whether host resolves to a loopback address.
func IsLoopback(host string) bool {
	ip, err := ResolveIP(host)
	return err == nil && ip.IsLoopback()
}

// LocalIP is the address to listen on: that of the interface named ifname
// (SLIME_SOCKET_IFNAME), or the one this host uses to reach master (its own
// address when master is this host).
func LocalIP(ifname, master string) (string, error) {
	if ifname != "" {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return "", fmt.Errorf("netaddr: SLIME_SOCKET_IFNAME=%s: %w", ifname, err)
		}
		addrs, err := ifi.Addrs()
		if err != nil {
			return "", fmt.Errorf("netaddr: SLIME_SOCKET_IFNAME=%s: %w", ifname, err)
		}
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
				return ipn.IP.String(), nil
			}
		}
		return "", fmt.Errorf("netaddr: SLIME_SOCKET_IFNAME=%s has no IPv4 address", ifname)
	}
	if master == "" {
		master = "127.0.0.1"
	}
	ip, err := ResolveIP(master)
	if err != nil {
		return "", err
	}
	// A UDP "connection" sends nothing; it asks the routing table which
	// local address reaches the master.
	c, err := net.Dial("udp", net.JoinHostPort(ip.String(), "9"))
	if err != nil {
		return "", fmt.Errorf("netaddr: no route to the master %s: %w", master, err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP.String(), nil
}

// ListenIP is the address a job's store or transport binds on this host:
// that of the interface named ifname (SLIME_SOCKET_IFNAME) when given, else
// the one that reaches master. When the job spans hosts and master is a
// name that resolves to loopback here (Debian maps a host's own name to
// 127.0.1.1), the other hosts could never reach that: the host's one non-loopback IPv4 address is
// used instead, and with several the caller must choose (an error naming
// them).
func ListenIP(ifname, master string, spansHosts bool) (string, error) {
	ip, err := LocalIP(ifname, master)
	// A master given as a loopback address is meant: jobs of several
	// "hosts" on one machine (launchers side by side, tests) bind it. So
	// is a name that is loopback on every host (localhost): the other
	// hosts, and this one's workers, dial their own loopback with it.
	if err != nil || ifname != "" || !spansHosts || !net.ParseIP(ip).IsLoopback() || net.ParseIP(master) != nil || loopbackName(master) {
		return ip, err
	}
	var found []string
	ifs, err := net.Interfaces()
	if err != nil {
		return "", fmt.Errorf("netaddr: %w", err)
	}
	for _, ifi := range ifs {
		if ifi.Flags&net.FlagUp == 0 || ifi.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := ifi.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() {
				found = append(found, ifi.Name+"="+ipn.IP.String())
			}
		}
	}
	if len(found) == 1 {
		_, addr, _ := cutEq(found[0])
		return addr, nil
	}
	return "", fmt.Errorf("%w: the master %s is loopback (%s) on this host, but the job spans hosts, which cannot reach that; this host has %d other IPv4 addresses %v: set SLIME_SOCKET_IFNAME, or give the master as an address the other hosts reach",
		ErrNoListenAddr, master, ip, len(found), found)
}

// loopbackName reports whether name is a host name that means loopback
// on every host: localhost and its subdomains (RFC 6761), and the names
// distributions give ::1.
func loopbackName(name string) bool {
	n := strings.ToLower(strings.TrimSuffix(name, "."))
	switch n {
	case "localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback":
		return true
	}
	return strings.HasSuffix(n, ".localhost")
}

// ErrNoListenAddr: no address of this host can be chosen for a job that
// spans hosts.
var ErrNoListenAddr = errors.New("netaddr: no address to listen on")

func cutEq(s string) (string, string, bool) {
	for i := range len(s) {
		if s[i] == '=' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}
