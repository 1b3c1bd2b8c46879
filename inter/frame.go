package inter

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Every message on a data connection is a header followed by Count bytes:
//
//	u16 magic  u8 version  u8 kind
//	u32 sender's global rank
//	u64 epoch (the call)
//	u64 hash of the call's sizes (both sides must agree)
//	u64 byte count of the payload that follows
const (
	frameMagic   = 0x5347 // "SG"
	frameVersion = 1
	// HeaderSize is the size of an encoded Header.
	HeaderSize = 32
	// MaxCount bounds the payload of one frame.
	MaxCount = 1 << 40
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
	if h.Count > MaxCount {
		return h, fmt.Errorf("%w: count %d", ErrFrame, h.Count)
	}
	return h, nil
}
