package rendezvous

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Wire format. Every message, request or response, is one frame:
//
//	u32  length of what follows (little endian)
//	u8   version (wireVersion)
//	u8   op (requests) or status (responses)
//	u16  number of keys
//	u32  timeout in milliseconds (blocking requests)
//	i64  integer argument or result (Add)
//	keys: u32 length + bytes, repeated
//	u32  value length + value bytes
//	u32  second value length + bytes (CompareAndSet's desired value)
//
// One layout for all ops keeps the decoder small enough to fuzz exhaustively.
// Frames follow internal/auth's handshake on every connection.
//
// A server reads frames of at most frameLimit(MaxValueBytes) bytes: a frame
// that announces more is answered statusBadRequest and its body skipped
// through a small buffer, never allocated. Once a frame's first byte has
// come, the rest must come within the server's FrameTimeout.
//
// Abort (opAbort) carries the aborted key prefix as its one key, the rank
// that aborted as the integer argument and the reason as the value. A
// blocking request that an abort fails is answered statusAborted with the
// same three fields (prefix, rank, reason), so that the waiter learns who
// failed and why. New ops and statuses are added without a version bump: an
// older peer answers an unknown op with statusBadRequest.

const (
	wireVersion  = 1
	fixedHeader  = 1 + 1 + 2 + 4 + 8
	lengthPrefix = 4

	// MaxKeyBytes is the longest key a server accepts.
	MaxKeyBytes = 4 << 10
	// MaxCallKeys is the most keys one frame carries (its key count is
	// 16 bits): a Wait or Check on more goes as several frames, and a
	// Barrier has at most this many members.
	MaxCallKeys = 1<<16 - 1
	// maxKeyListBytes bounds the keys of one frame, length prefixes
	// included: a Wait on 65535 keys of 60 bytes fits.
	maxKeyListBytes = 4 << 20
	// maxValueLimit is the largest ServerConfig.MaxValueBytes; a client
	// accepts any frame a server so configured may send.
	maxValueLimit = 256 << 20
	// keepBufBytes: a connection keeps its frame buffers between frames
	// only up to this size, so that one large frame does not pin its
	// memory for the connection's whole life.
	keepBufBytes = 64 << 10
)

// frameLimit is the largest frame that can carry values of up to
// maxValue bytes: the header, the key list and two values
// (CompareAndSet's). A frame that announces more is refused before any of
// it is allocated.
func frameLimit(maxValue int) uint32 {
	return uint32(fixedHeader + maxKeyListBytes + 2*(4+maxValue))
}

type op uint8

const (
	opSet op = iota + 1
	opGet
	opAdd
	opCompareAndSet
	opWait
	opDelete
	opCheck
	opNumKeys
	opAbort
)

func (o op) String() string {
	switch o {
	case opSet:
		return "set"
	case opGet:
		return "get"
	case opAdd:
		return "add"
	case opCompareAndSet:
		return "compare-and-set"
	case opWait:
		return "wait"
	case opDelete:
		return "delete"
	case opCheck:
		return "check"
	case opNumKeys:
		return "num-keys"
	case opAbort:
		return "abort"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Response statuses.
const (
	statusOK uint8 = iota
	statusTimeout
	statusNotFound
	statusFalse
	statusBadRequest
	statusAborted
)

// message is the decoded form of one frame.
type message struct {
	Code      uint8 // op for requests, status for responses
	TimeoutMS uint32
	N         int64
	Keys      []string
	Value     []byte
	Value2    []byte
}

// errMalformed is returned by decode for a frame that breaks the format.
var errMalformed = errors.New("rendezvous: malformed frame")

// encode appends m as one frame to b.
func (m *message) encode(b []byte) []byte {
	n := fixedHeader + 4 + len(m.Value) + 4 + len(m.Value2)
	for _, k := range m.Keys {
		n += 4 + len(k)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(n))
	b = append(b, wireVersion, m.Code)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(m.Keys)))
	b = binary.LittleEndian.AppendUint32(b, m.TimeoutMS)
	b = binary.LittleEndian.AppendUint64(b, uint64(m.N))
	for _, k := range m.Keys {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(k)))
		b = append(b, k...)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.Value)))
	b = append(b, m.Value...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.Value2)))
	b = append(b, m.Value2...)
	return b
}

// decode parses the body of one frame (everything after the length prefix).
// It never panics and never allocates more than the body's size.
func decode(body []byte) (message, error) {
	var m message
	if len(body) < fixedHeader {
		return m, fmt.Errorf("%w: %d-byte body is shorter than the %d-byte header", errMalformed, len(body), fixedHeader)
	}
	if body[0] != wireVersion {
		return m, fmt.Errorf("%w: version %d, want %d", errMalformed, body[0], wireVersion)
	}
	m.Code = body[1]
	nkeys := int(binary.LittleEndian.Uint16(body[2:]))
	m.TimeoutMS = binary.LittleEndian.Uint32(body[4:])
	m.N = int64(binary.LittleEndian.Uint64(body[8:]))
	rest := body[fixedHeader:]
	field := func(what string) ([]byte, error) {
		if len(rest) < 4 {
			return nil, fmt.Errorf("%w: truncated %s length", errMalformed, what)
		}
		n := binary.LittleEndian.Uint32(rest)
		rest = rest[4:]
		if uint64(n) > uint64(len(rest)) {
			return nil, fmt.Errorf("%w: %s of %d bytes overruns the frame", errMalformed, what, n)
		}
		if n == 0 {
			// nil, not an empty slice of the frame: that would keep the
			// frame's whole buffer alive for as long as the message lives
			// (a blocked request's, its timeout).
			return nil, nil
		}
		f := rest[:n:n]
		rest = rest[n:]
		return f, nil
	}
	if nkeys > 0 {
		// Each key takes at least 4 bytes: reject counts the body cannot hold
		// before allocating the slice.
		if nkeys*4 > len(rest) {
			return m, fmt.Errorf("%w: %d keys cannot fit in %d bytes", errMalformed, nkeys, len(rest))
		}
		m.Keys = make([]string, nkeys)
		for i := range m.Keys {
			k, err := field("key")
			if err != nil {
				return m, err
			}
			m.Keys[i] = string(k)
		}
	}
	v, err := field("value")
	if err != nil {
		return m, err
	}
	m.Value = v
	v2, err := field("second value")
	if err != nil {
		return m, err
	}
	m.Value2 = v2
	if len(rest) != 0 {
		return m, fmt.Errorf("%w: %d trailing bytes", errMalformed, len(rest))
	}
	return m, nil
}

// frameTooLargeError is readFrame's error for a frame that announces more
// than the limit; its body (N bytes) is still unread.
type frameTooLargeError struct{ N, Limit uint32 }

func (e *frameTooLargeError) Error() string {
	return fmt.Sprintf("rendezvous: malformed frame: frame of %d bytes exceeds the %d-byte limit", e.N, e.Limit)
}

func (e *frameTooLargeError) Is(target error) bool { return target == errMalformed }

// readFrame reads one frame of at most limit bytes from r into buf (grown
// as needed) and decodes it. A frame that announces more than limit is a
// *frameTooLargeError, returned before anything is allocated for it and
// with its body left unread.
func readFrame(r io.Reader, buf *[]byte, limit uint32) (message, error) {
	var lp [lengthPrefix]byte
	if _, err := io.ReadFull(r, lp[:]); err != nil {
		return message{}, err
	}
	n := binary.LittleEndian.Uint32(lp[:])
	if n > limit {
		return message{}, &frameTooLargeError{N: n, Limit: limit}
	}
	body, err := readBody(r, buf, int(n))
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return message{}, err
	}
	return decode(body)
}

// growStep is the least a frame's buffer grows by while its body comes.
const growStep = 64 << 10

// readBody reads n bytes into *buf. A buffer too small grows as the bytes
// arrive, not to n at once: a length prefix alone (a member that
// announces frames of the limit on many connections and sends nothing
// more) makes the server hold no more than what was sent.
func readBody(r io.Reader, buf *[]byte, n int) ([]byte, error) {
	if cap(*buf) >= n {
		body := (*buf)[:n]
		_, err := io.ReadFull(r, body)
		return body, err
	}
	b := (*buf)[:0]
	for len(b) < n {
		if len(b) == cap(b) {
			nb := make([]byte, len(b), min(n, max(2*cap(b), growStep)))
			copy(nb, b)
			b = nb
			*buf = b
		}
		m, err := r.Read(b[len(b):min(cap(b), n)])
		b = b[:len(b)+m]
		if err != nil && len(b) < n {
			return nil, err
		}
	}
	return b, nil
}
