package auth

import (
	"encoding/binary"
	"net"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// peerUID returns the owner of the socket at the other end of c where that
// socket is on this host, in this network namespace (found false where it
// is not: a connection from another host, or another namespace; or where
// the kernel would not say). It asks the kernel for that one socket
// (sock_diag: a lookup in its table of connections, by the four addresses
// and ports; the socket's local address is c's remote one and the other
// way round), as an IPv4 socket and, where the address is IPv4, as a
// dual-stack IPv6 one too. The uid is that of the process that made the
// socket (for an accepted one, the listener's).
func peerUID(c net.Conn) (uid uint32, found bool) {
	local, ok1 := c.LocalAddr().(*net.TCPAddr)
	remote, ok2 := c.RemoteAddr().(*net.TCPAddr)
	if !ok1 || !ok2 {
		return 0, false
	}
	if src, dst := remote.IP.To4(), local.IP.To4(); src != nil && dst != nil {
		if uid, found := diagLookup(unix.AF_INET, src, remote.Port, dst, local.Port); found {
			return uid, true
		}
	}
	src, dst := remote.IP.To16(), local.IP.To16()
	if src == nil || dst == nil {
		return 0, false
	}
	return diagLookup(unix.AF_INET6, src, remote.Port, dst, local.Port)
}

// diagSeq numbers the requests (a reply must answer this request).
var diagSeq atomic.Uint32

// The kernel's structures of a sock_diag request and its answer
// (linux/inet_diag.h), laid out by hand: the request is a netlink header,
// then inet_diag_req_v2 (family, protocol, extensions, pad, states, then
// the socket's id: source and destination ports, big-endian; source and
// destination addresses, 16 bytes each; interface; cookie); the answer's
// inet_diag_msg holds the uid after its family, state, timer, retrans
// (4 bytes), the id (48) and expires, rqueue, wqueue (12).
const (
	diagReqLen  = unix.NLMSG_HDRLEN + 56
	diagUIDOff  = unix.NLMSG_HDRLEN + 64
	diagMsgLen  = unix.NLMSG_HDRLEN + 72
	diagTimeout = 1 // seconds: a netlink answer is immediate
)

// diagLookup asks the kernel for the TCP socket of family whose local
// address is src:sport and remote one dst:dport, and returns its uid.
func diagLookup(family int, src []byte, sport int, dst []byte, dport int) (uint32, bool) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return 0, false
	}
	defer unix.Close(fd)
	tv := unix.Timeval{Sec: diagTimeout}
	if unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv) != nil {
		return 0, false
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
	id := b[8:]
	binary.BigEndian.PutUint16(id[0:], uint16(sport))
	binary.BigEndian.PutUint16(id[2:], uint16(dport))
	copy(id[4:20], src)
	copy(id[20:36], dst)
	ne.PutUint32(id[40:], 0xffffffff) // INET_DIAG_NOCOOKIE: any socket of that id
	ne.PutUint32(id[44:], 0xffffffff)
	if err := unix.Sendto(fd, req[:], 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, false
	}
	var ans [512]byte
	for {
		n, _, err := unix.Recvfrom(fd, ans[:], 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n < unix.NLMSG_HDRLEN {
			return 0, false
		}
		if ne.Uint32(ans[8:]) != seq {
			continue // not the answer to this request
		}
		// An error (ENOENT: no such socket) or the socket's record.
		if ne.Uint16(ans[4:]) != unix.SOCK_DIAG_BY_FAMILY || n < diagMsgLen || int(ne.Uint32(ans[0:])) < diagMsgLen {
			return 0, false
		}
		return ne.Uint32(ans[diagUIDOff:]), true
	}
}
