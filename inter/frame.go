package inter

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Every frame on a data connection is a header followed by Count bytes:
//
//	u16 magic  u8 version  u8 kind
//	u32 sender's global rank
//	u64 epoch (the call)
//	u64 hash of the call's sizes (both sides must agree)
//	u64 byte count of the payload that follows
//	u64 total: the message's bytes over all its frames
//	u32 stripes: the connections, from the first, that carry a frame of
//	    the message (the first frame's tells the receiver which to read)
//	u32 zero
const (
	frameMagic   = 0x5347 // "SG"
	frameVersion = 2
	// HeaderSize is the size of an encoded Header.
	HeaderSize = 48
	// MaxCount bounds the payload of one frame and a message's total.
	MaxCount = 1 << 40
	// MaxStripes bounds the connections one message is striped over.
	MaxStripes = 256
)

// Frame kinds.
const (
	KindData  uint8 = 1 // a block (or a channel's stripe of one)
	KindHello uint8 = 2 // first frame of a connection: Epoch is the channel
)

// Header is a decoded frame header.
type Header struct {
	Kind   uint8
	Sender uint32
	Epoch  uint64
	Hash   uint64
	Count  uint64
	Total  uint64
	// Stripes is 1 or more in a data frame, 0 in a hello.
	Stripes uint32
}

// ErrFrame marks a header that breaks the format: the connection is not
// speaking this protocol, or is out of step.
var ErrFrame = errors.New("inter: malformed frame")

// Put encodes h into b, which holds at least HeaderSize bytes.
func (h *Header) Put(b []byte) {
	_ = b[HeaderSize-1]
	binary.LittleEndian.PutUint16(b[0:], frameMagic)
	b[2], b[3] = frameVersion, h.Kind
	binary.LittleEndian.PutUint32(b[4:], h.Sender)
	binary.LittleEndian.PutUint64(b[8:], h.Epoch)
	binary.LittleEndian.PutUint64(b[16:], h.Hash)
	binary.LittleEndian.PutUint64(b[24:], h.Count)
	binary.LittleEndian.PutUint64(b[32:], h.Total)
	binary.LittleEndian.PutUint32(b[40:], h.Stripes)
	binary.LittleEndian.PutUint32(b[44:], 0)
}

// Decode parses a header from b; it never panics.
func Decode(b []byte) (Header, error) {
	var h Header
	if len(b) < HeaderSize {
		return h, fmt.Errorf("%w: %d bytes, want %d", ErrFrame, len(b), HeaderSize)
	}
	if m := binary.LittleEndian.Uint16(b[0:]); m != frameMagic {
		return h, fmt.Errorf("%w: magic %#x", ErrFrame, m)
	}
	if b[2] != frameVersion {
		return h, fmt.Errorf("%w: version %d, want %d", ErrFrame, b[2], frameVersion)
	}
	h.Kind = b[3]
	if h.Kind != KindData && h.Kind != KindHello {
		return h, fmt.Errorf("%w: kind %d", ErrFrame, h.Kind)
	}
	h.Sender = binary.LittleEndian.Uint32(b[4:])
	h.Epoch = binary.LittleEndian.Uint64(b[8:])
	h.Hash = binary.LittleEndian.Uint64(b[16:])
	h.Count = binary.LittleEndian.Uint64(b[24:])
	h.Total = binary.LittleEndian.Uint64(b[32:])
	h.Stripes = binary.LittleEndian.Uint32(b[40:])
	if h.Count > MaxCount || h.Total > MaxCount {
		return h, fmt.Errorf("%w: count %d of %d", ErrFrame, h.Count, h.Total)
	}
	if h.Kind == KindData && (h.Stripes == 0 || h.Stripes > MaxStripes || h.Count > h.Total) ||
		h.Kind == KindHello && (h.Stripes != 0 || h.Count != 0 || h.Total != 0) {
		return h, fmt.Errorf("%w: %d bytes of %d in one of %d stripes", ErrFrame, h.Count, h.Total, h.Stripes)
	}
	if z := binary.LittleEndian.Uint32(b[44:]); z != 0 {
		return h, fmt.Errorf("%w: reserved field %#x", ErrFrame, z)
	}
	return h, nil
}
