package auth

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"net"
	"os"
	"strconv"
	"strings"
)

// peerUID returns the owner of the socket at the other end of c where that
// socket is on this host, in this network namespace (found false where it
// is not: a connection from another host, or another namespace): the
// kernel's table of TCP sockets (/proc/net/tcp and tcp6) lists it with
// c's remote address as its local one and c's local address as its
// remote one, and the uid of the process that made it (for an accepted
// socket, the listener's).
func peerUID(c net.Conn) (uid uint32, found bool) {
	local, ok1 := c.LocalAddr().(*net.TCPAddr)
	remote, ok2 := c.RemoteAddr().(*net.TCPAddr)
	if !ok1 || !ok2 {
		return 0, false
	}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		if uid, found := findSocket(table, remote, local); found {
			return uid, true
		}
	}
	return 0, false
}

// findSocket looks in table for the socket whose local address is local
// and whose remote address is remote, and returns its owner.
func findSocket(table string, local, remote *net.TCPAddr) (uint32, bool) {
	f, err := os.Open(table)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	s.Scan() // the header
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 8 {
			continue
		}
		if !sameAddr(fields[1], local) || !sameAddr(fields[2], remote) {
			continue
		}
		uid, err := strconv.ParseUint(fields[7], 10, 32)
		if err != nil {
			return 0, false
		}
		return uint32(uid), true
	}
	return 0, false
}

// sameAddr reports whether field, an address as the kernel's tables write
// it ("0100007F:1F90": the address's 32-bit words in this host's byte
// order, then the port, in hex), is a.
func sameAddr(field string, a *net.TCPAddr) bool {
	host, port, ok := strings.Cut(field, ":")
	if !ok || (len(host) != 8 && len(host) != 32) {
		return false
	}
	p, err := strconv.ParseUint(port, 16, 16)
	if err != nil || int(p) != a.Port {
		return false
	}
	raw, err := hex.DecodeString(host)
	if err != nil {
		return false
	}
	ip := make(net.IP, len(raw))
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(ip[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	return ip.Equal(a.IP) // an IPv4-mapped IPv6 address equals its IPv4 one
}
