package inter

import (
	"io"
	"net"

	"golang.org/x/sys/unix"
)

// Reader reads whole blocks from a TCP connection, waking once per Lowat
// bytes instead of once per arriving segment: before each read it sets the
// socket's low-water mark (SO_RCVLOWAT) to the smaller of Lowat and what is
// left of the block, so that the kernel neither wakes the reader for every
// 64 KiB nor waits for bytes that will not come. On a link whose bandwidth
// is bounded by the CPU (the kernel's copies), the wake-ups saved are
// bandwidth gained. A Lowat of 0 or less reads as io.ReadFull does. (The
// kernel caps the mark at half the receive buffer, or, where autotuning
// sizes that buffer, at half the largest it may grow to, and grows it to
// fit.)
type Reader struct {
	c     *net.TCPConn
	fd    int // the socket, for setsockopt; valid while c is open
	Lowat int
	cur   int // the low-water mark set now
}

// NewReader reads from c with the given low-water mark bound (0: none).
func NewReader(c *net.TCPConn, lowat int) Reader {
	r := Reader{c: c, fd: -1, Lowat: lowat, cur: 1}
	if rc, err := c.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { r.fd = int(fd) })
	}
	return r
}

// SetLowat makes the socket wake its reader once min(n, Lowat) bytes are
// there (at least 1).
func (r *Reader) SetLowat(n int) {
	if r.Lowat <= 0 || r.fd < 0 {
		return
	}
	n = max(min(n, r.Lowat), 1)
	if n != r.cur {
		unix.SetsockoptInt(r.fd, unix.SOL_SOCKET, unix.SO_RCVLOWAT, n)
		r.cur = n
	}
}

// lowatMin is the least that is worth a low-water mark: below it a read
// takes what is there, so that small messages pay no setsockopt (one
// costs about as much as the wake-ups it would save).
const lowatMin = 256 << 10

// ReadFull reads len(buf) bytes (io.ErrUnexpectedEOF if the stream ends
// first). It allocates nothing.
func (r *Reader) ReadFull(buf []byte) error {
	for len(buf) > 0 {
		if len(buf) >= lowatMin {
			r.SetLowat(len(buf))
		} else {
			r.SetLowat(1)
		}
		n, err := r.c.Read(buf)
		buf = buf[n:]
		if err != nil {
			if err == io.EOF && len(buf) > 0 {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}
