package auth

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// peerUID returns the owner of the socket at the other end of c where that
// socket is on this host, in this network namespace: found says whether
// the kernel lists it (not a connection from another host, or another
// namespace), gone whether it lists it closed (TIME_WAIT: its process has
// let go of it, and the kernel names no owner). It asks the kernel for
// that one connection (sock_diag: a lookup by the four addresses and
// ports; the socket's local address is c's remote one and the other way
// round), and takes the answer only where it is that connection, not a
// listener the lookup falls back to; where sock_diag cannot be asked (a
// kernel or sandbox without it), it reads the kernel's tables
// (/proc/net/tcp, tcp6) instead. The uid is that of the process that made
// the socket (for an accepted one, the listener's).
func peerUID(c net.Conn) (uid uint32, found, gone bool) {
	local, ok1 := c.LocalAddr().(*net.TCPAddr)
	remote, ok2 := c.RemoteAddr().(*net.TCPAddr)
	if !ok1 || !ok2 {
		return 0, false, false
	}
	uid, st, err := diagLookup(remote, local)
	if err != nil {
		return procLookup(remote, local)
	}
	switch st {
	case stateNone:
		return 0, false, false
	case stateClosed:
		return 0, true, true
	}
	return uid, true, false
}

// The states of the answer (linux/tcp_states.h) this lookup tells apart.
const (
	tcpTimeWait = 6
	tcpListen   = 10
)

type lookupState int

const (
	stateNone   lookupState = iota // no such connection here
	stateOpen                      // the connection, with its owner
	stateClosed                    // the connection, closed (TIME_WAIT): no owner
)

// diagSeq numbers the requests (a reply must answer this request).
var diagSeq atomic.Uint32

// The kernel's structures of a sock_diag request and its answer
// (linux/inet_diag.h), laid out by hand: the request is a netlink header,
// then inet_diag_req_v2 (family, protocol, extensions, pad, states, then
// the socket's id: source and destination ports, big-endian; source and
// destination addresses, 16 bytes each; interface; cookie); the answer's
// inet_diag_msg holds its family, state, timer and retrans (a byte each),
// the id (48 bytes), expires, rqueue and wqueue (12), the uid and the
// inode.
const (
	diagReqLen   = unix.NLMSG_HDRLEN + 56
	diagIDOff    = unix.NLMSG_HDRLEN + 4
	diagUIDOff   = unix.NLMSG_HDRLEN + 64
	diagInodeOff = unix.NLMSG_HDRLEN + 68
	diagMsgLen   = unix.NLMSG_HDRLEN + 72
	diagTimeout  = 1 // seconds: a netlink answer is immediate
)

// diagLookup asks the kernel for the TCP connection whose local address is
// src and remote one dst, as an IPv4 socket, and, where that finds none,
// as an IPv6 one (a dual-stack socket's v4-mapped addresses). An error
// says the kernel could not be asked.
func diagLookup(src, dst *net.TCPAddr) (uint32, lookupState, error) {
	if s4, d4 := src.IP.To4(), dst.IP.To4(); s4 != nil && d4 != nil {
		uid, st, err := diagOne(unix.AF_INET, s4, src.Port, d4, dst.Port)
		if err != nil || st != stateNone {
			return uid, st, err
		}
	}
	s16, d16 := src.IP.To16(), dst.IP.To16()
	if s16 == nil || d16 == nil {
		return 0, stateNone, nil
	}
	return diagOne(unix.AF_INET6, s16, src.Port, d16, dst.Port)
}

// errNoDiag: sock_diag gave no answer this lookup can use.
var errNoDiag = errors.New("auth: sock_diag unavailable")

// diagOne asks for the TCP socket of family whose local address is
// src:sport and remote one dst:dport.
func diagOne(family int, src []byte, sport int, dst []byte, dport int) (uint32, lookupState, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return 0, stateNone, err
	}
	defer unix.Close(fd)
	tv := unix.Timeval{Sec: diagTimeout}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return 0, stateNone, err
	}
	seq := diagSeq.Add(1)
	var req [diagReqLen]byte
	ne := binary.NativeEndian
	ne.PutUint32(req[0:], diagReqLen)
	ne.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(req[6:], unix.NLM_F_REQUEST)
	ne.PutUint32(req[8:], seq)
	b := req[unix.NLMSG_HDRLEN:]
	b[0], b[1] = byte(family), unix.IPPROTO_TCP
	ne.PutUint32(b[4:], 0xffffffff) // every state
	id := b[8:56]
	binary.BigEndian.PutUint16(id[0:], uint16(sport))
	binary.BigEndian.PutUint16(id[2:], uint16(dport))
	copy(id[4:20], src)
	copy(id[20:36], dst)
	ne.PutUint32(id[40:], 0xffffffff) // INET_DIAG_NOCOOKIE: any socket of that id
	ne.PutUint32(id[44:], 0xffffffff)
	if err := unix.Sendto(fd, req[:], 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, stateNone, err
	}
	var ans [512]byte
	for {
		n, _, err := unix.Recvfrom(fd, ans[:], 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, stateNone, err
		}
		if n < unix.NLMSG_HDRLEN {
			return 0, stateNone, errNoDiag
		}
		if ne.Uint32(ans[8:]) != seq {
			continue // not the answer to this request
		}
		if ne.Uint16(ans[4:]) == unix.NLMSG_ERROR {
			// ENOENT: no such socket. Anything else: the kernel could
			// not say (no TCP diagnostics, a filter).
			if n >= unix.NLMSG_HDRLEN+4 && int32(ne.Uint32(ans[unix.NLMSG_HDRLEN:])) == -int32(unix.ENOENT) {
				return 0, stateNone, nil
			}
			return 0, stateNone, errNoDiag
		}
		if ne.Uint16(ans[4:]) != unix.SOCK_DIAG_BY_FAMILY || n < diagMsgLen || int(ne.Uint32(ans[0:])) < diagMsgLen {
			return 0, stateNone, errNoDiag
		}
		// The lookup falls back to a listener on the port where it finds
		// no connection (one of another user's, bound to every address):
		// only the connection asked for is an answer.
		got := ans[diagIDOff : diagIDOff+36]
		switch state := ans[unix.NLMSG_HDRLEN+1]; {
		case state == tcpListen || string(got[0:4]) != string(id[0:4]) || string(got[4:4+len(src)]) != string(src) || string(got[20:20+len(dst)]) != string(dst):
			return 0, stateNone, nil
		case state == tcpTimeWait || ne.Uint32(ans[diagInodeOff:]) == 0:
			return 0, stateClosed, nil
		}
		return ne.Uint32(ans[diagUIDOff:]), stateOpen, nil
	}
}

// procLookup is peerUID from the kernel's tables of TCP sockets, where
// sock_diag cannot be asked: the socket whose local address is local and
// remote one remote, in /proc/net/tcp or tcp6.
func procLookup(local, remote *net.TCPAddr) (uid uint32, found, gone bool) {
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		if uid, st := procTable(table, local, remote); st != stateNone {
			return uid, true, st == stateClosed
		}
	}
	return 0, false, false
}

// procTable looks in one table (lines "sl local rem st ... uid timeout
// inode"); both addresses must match, so that a listener (its remote
// address all zeros) is never taken for a connection.
func procTable(table string, local, remote *net.TCPAddr) (uint32, lookupState) {
	f, err := os.Open(table)
	if err != nil {
		return 0, stateNone
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	s.Scan() // the header
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 10 || !sameAddr(fields[1], local) || !sameAddr(fields[2], remote) {
			continue
		}
		st, err := strconv.ParseUint(fields[3], 16, 8)
		if err != nil {
			continue
		}
		if st == tcpTimeWait || fields[9] == "0" {
			return 0, stateClosed
		}
		uid, err := strconv.ParseUint(fields[7], 10, 32)
		if err != nil {
			return 0, stateNone
		}
		return uint32(uid), stateOpen
	}
	return 0, stateNone
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
