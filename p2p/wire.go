package p2p

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/slimego/slimego/kernels"
)

// The wire protocol (docs/P2P.md). Every connection of a link starts with
// internal/auth's handshake (purpose "p2p:", the acceptor's name, "@" and
// its address), then a hello and its answer;
// after that each direction is a sequence of frames, each a header and a
// payload of the header's Payload bytes:
//
//	u16 magic "P2"  u8 version  u8 kind
//	u8  sub (the request's kind in a request or response)  u8 status
//	u16 ch   (a read request (rRead): the connection that carries its
//	          answer, which need not be the one the request came on; zero
//	          in every other frame)
//	u64 id   (the request; ids are never reused on a link)
//	u64 a    (a length, an immediate, a session)
//	u32 b    (the number of descriptors, a channel count)
//	u32 payload bytes that follow
//
// A frame is decoded by Decode, which checks every field before anything
// is allocated or read for its payload.
const (
	wireMagic   = 0x5032 // "P2"
	wireVersion = 6
	// HeaderSize is the size of an encoded frame header.
	HeaderSize = 32
	// DescSize is the size of one encoded remote descriptor.
	DescSize = 32
	// MaxBatch bounds the operations of one batched call, and so the
	// descriptors of one request.
	MaxBatch = 4096
	// ChunkMax bounds one data frame's payload: a sender checks for
	// cancellation between chunks, so it also bounds how long a
	// cancelled transfer may still touch its buffer: the chunk each of
	// the link's connections is moving (a few milliseconds per chunk on
	// a link of a few GB/s). Each frame costs its reader a wake-up for
	// the header before it reads the payload with its low-water mark, so
	// larger frames cost fewer.
	ChunkMax = 4 << 20
	// MaxLen bounds the bytes of one operation and of one request.
	MaxLen = 1 << 40
	// MaxName bounds an endpoint's name.
	MaxName = 128
	// stripeSize is the u64 that starts a read or write request's
	// payload: where its stripe starts in the batch's bytes.
	stripeSize = 8
	// immSize is the immediate that ends an rWriteImm request's payload.
	immSize = 8
	// helloFixed is the part of a hello's payload before the name: the
	// heartbeat (u32 ms) and the connector's pid (u32).
	helloFixed = 8
	// maxHeartbeatMS bounds the heartbeat a hello proposes; a link takes
	// the shorter of its two ends' (at least minHeartbeat).
	maxHeartbeatMS = 1 << 31
)

// Frame kinds.
const (
	kHello    uint8 = 1  // connector → acceptor: id session, a channel, b channels, payload u32 heartbeat ms, u32 pid and name
	kHelloAck uint8 = 2  // acceptor → connector: status, a heartbeat ms, id the tag of its name (nameTag; 0: unchecked)
	kReq      uint8 = 3  // a request: sub says which
	kData     uint8 = 4  // a chunk of a request's or a response's bytes
	kEnd      uint8 = 5  // the bytes of id end early (status says why)
	kResp     uint8 = 6  // the answer to request id of kind sub
	kPing     uint8 = 7  // heartbeat
	kRelease  uint8 = 8  // the initiator is done with the memory granted for request id
	kCancel   uint8 = 9  // the initiator gave read id up: stop sending its bytes
	kRevoke   uint8 = 10 // the target takes lease id back (its region is deregistered): release it once no copy uses it
	kindLast        = kRevoke
)

// Request kinds (sub of kReq and kResp).
const (
	rRead  uint8 = 1 // u64 lo and the batch's b descriptors: a bytes from lo; answered by kResp, then a bytes of kData
	rWrite uint8 = 2 // u64 lo and the batch's b descriptors, then a bytes of kData; answered by kResp
	rImm   uint8 = 3 // a = the immediate; answered by kResp
	rRTS   uint8 = 4 // a send of a bytes, sequence id, is ready (no answer until matched)
	rCTS   uint8 = 5 // the receive for sequence id is posted (status: or refused)
	rSend  uint8 = 6 // the bytes of send id: a bytes of kData, answered by kResp; or, with a status, a send given up
	// Same host: a read or write request as rRead and rWrite, whose
	// answer grants the stripe's memory (b iovecs) for the initiator to
	// copy, until it sends kRelease. An iovec is
	//
	//	u64 address (in the target)  u64 length
	//	u64 memory  u64 offset  u32 fd  u32 zero
	//
	// where memory is 0 for plain memory, which the initiator copies with
	// process_vm_readv/writev at the address; or it names the target's
	// Shared memory, the file at fd in the target's process, which the
	// initiator maps and copies at offset in it (or, where it cannot map
	// it, copies at the address as for plain memory).
	rReadV  uint8 = 7
	rWriteV uint8 = 8
	// Same host: a lease of a whole region, asked as a read of it (one
	// descriptor, its whole length) and granted as rReadV's answer (one
	// iovec); the initiator then copies to and from the region itself,
	// with no request per transfer, until the target revokes it (kRevoke)
	// and the initiator releases it (kRelease).
	rLease uint8 = 9
	// Same host, from an initiator whose local ranges are GPU memory: a
	// read or write request as rRead and rWrite, whose answer grants the
	// target's GPU memory (b records) for the initiator to open with CUDA
	// IPC and copy device to device, until it sends kRelease; or, where
	// a range is not GPU memory, stNotHost (ask again over TCP). A
	// record is
	//
	//	64 bytes an IPC handle of an allocation
	//	u64 offset (of the range in the allocation)  u64 length
	rReadG  uint8 = 10
	rWriteG uint8 = 11
	// Same host: a lease of a region of GPU memory, asked as rLease is
	// and granted as rReadG's answer (one record), for an initiator
	// whose own memory is GPU memory: it opens the handle and copies
	// device to device with no request per transfer until the target
	// revokes the lease (kRevoke) and it releases it (kRelease), having
	// closed the handle.
	rLeaseG uint8 = 12
	// A write that ends with an immediate (WriteWithImm of one stripe):
	// rWrite's payload and then u64 the immediate (at most 32 bits). The
	// target queues the immediate once the bytes are in place, and answers
	// as for rWrite (kResp of sub rWrite): stOK, or stBusy when the bytes
	// are in place but the immediate was refused; a refused write queues
	// none.
	rWriteImm uint8 = 13
	subLast         = rWriteImm
	// IovSize is the size of one granted iovec.
	IovSize = 40
	// IPCRecSize is the size of one granted IPC record.
	IPCRecSize = kernels.IPCHandleBytes + 16
)

// Status codes, in a response, an end and a hello's answer.
const (
	stOK           uint8 = 0
	stBounds       uint8 = 1  // outside the region
	stKey          uint8 = 2  // wrong key
	stNoRegion     uint8 = 3  // no such region, or deregistered
	stInvalid      uint8 = 4  // a malformed request
	stCancelled    uint8 = 5  // the other side gave the transfer up
	stTooLarge     uint8 = 6  // a message larger than the posted receive
	stBusy         uint8 = 7  // the target holds too many undelivered immediates
	stDup          uint8 = 8  // hello: a link to this peer exists or is being made by the lower name
	stRefusedHello uint8 = 9  // hello: not accepted
	stNotHost      uint8 = 10 // a same-host grant asked for memory it cannot lend (GPU memory as host memory, host memory through IPC): ask again over TCP
	stDevice       uint8 = 11 // copying to or from GPU memory failed
	stClosing      uint8 = 12 // the target's endpoint is closing (its regions go with it)
	statusLast           = stClosing
)

var statusText = [...]string{
	stOK: "ok", stBounds: "outside the registered region", stKey: "wrong region key",
	stNoRegion: "no such region (never registered, or deregistered)", stInvalid: "malformed request",
	stCancelled: "cancelled", stTooLarge: "message larger than the posted receive",
	stBusy: "too many undelivered immediates (the batch's bytes are in place, its immediate is not delivered)", stDup: "duplicate link", stRefusedHello: "refused",
	stNotHost: "the memory cannot be granted so", stDevice: "a copy to or from GPU memory failed",
	stClosing: "the peer's endpoint was closed",
}

// ErrFrame marks a frame that breaks the format: the link is closed.
var ErrFrame = errors.New("p2p: malformed frame")

type header struct {
	kind, sub, status uint8
	ch                uint16 // rRead: the connection of the answer
	id, a             uint64
	b                 uint32
	payload           uint32
}

func (h *header) put(p []byte) {
	_ = p[HeaderSize-1]
	binary.LittleEndian.PutUint16(p[0:], wireMagic)
	p[2], p[3], p[4], p[5] = wireVersion, h.kind, h.sub, h.status
	binary.LittleEndian.PutUint16(p[6:], h.ch)
	binary.LittleEndian.PutUint64(p[8:], h.id)
	binary.LittleEndian.PutUint64(p[16:], h.a)
	binary.LittleEndian.PutUint32(p[24:], h.b)
	binary.LittleEndian.PutUint32(p[28:], h.payload)
}

// decodeHeader parses and checks a frame header; it never panics and
// allocates nothing. What it accepts is bounded: a payload is at most
// ChunkMax (data), MaxBatch descriptors (a request; and an immediate,
// rWriteImm) or MaxName (a hello), and every other frame has none.
func decodeHeader(p []byte) (header, error) {
	var h header
	if len(p) < HeaderSize {
		return h, fmt.Errorf("%w: %d bytes, want %d", ErrFrame, len(p), HeaderSize)
	}
	if m := binary.LittleEndian.Uint16(p[0:]); m != wireMagic {
		return h, fmt.Errorf("%w: magic %#x", ErrFrame, m)
	}
	if p[2] != wireVersion {
		return h, fmt.Errorf("%w: version %d, want %d", ErrFrame, p[2], wireVersion)
	}
	h.kind, h.sub, h.status = p[3], p[4], p[5]
	h.ch = binary.LittleEndian.Uint16(p[6:])
	if h.kind == kReq && h.sub == rRead {
		if h.ch >= MaxChannels { // the link's own count is checked where it is known
			return h, fmt.Errorf("%w: a read answered on connection %d", ErrFrame, h.ch)
		}
	} else if h.ch != 0 {
		return h, fmt.Errorf("%w: connection field %#x in a frame of kind %d sub %d", ErrFrame, h.ch, h.kind, h.sub)
	}
	h.id = binary.LittleEndian.Uint64(p[8:])
	h.a = binary.LittleEndian.Uint64(p[16:])
	h.b = binary.LittleEndian.Uint32(p[24:])
	h.payload = binary.LittleEndian.Uint32(p[28:])
	if h.kind == 0 || h.kind > kindLast {
		return h, fmt.Errorf("%w: kind %d", ErrFrame, h.kind)
	}
	if h.status > statusLast {
		return h, fmt.Errorf("%w: status %d", ErrFrame, h.status)
	}
	bad := func(what string) (header, error) {
		return h, fmt.Errorf("%w: kind %d sub %d: %s", ErrFrame, h.kind, h.sub, what)
	}
	switch h.kind {
	case kHello:
		if h.sub != 0 || h.status != 0 || h.payload <= helloFixed || h.payload > helloFixed+MaxName || h.b == 0 || h.b > MaxChannels || h.a >= uint64(h.b) {
			return bad("hello fields")
		}
	case kHelloAck:
		if h.sub != 0 || h.payload != 0 || h.a > maxHeartbeatMS || h.b != 0 || (h.status != stOK && h.status != stDup && h.status != stRefusedHello) {
			return bad("hello answer fields")
		}
	case kReq:
		if h.status != 0 && h.sub != rCTS && !(h.sub == rSend && h.a == 0) {
			return bad("status in a request")
		}
		switch h.sub {
		case rLease, rLeaseG:
			if h.b != 1 || h.payload != stripeSize+DescSize || h.a == 0 || h.a > MaxLen {
				return bad("lease fields")
			}
		case rRead, rWrite, rReadV, rWriteV, rReadG, rWriteG:
			if h.b == 0 || h.b > MaxBatch || h.payload != stripeSize+h.b*DescSize || h.a == 0 || h.a > MaxLen {
				return bad("descriptor count, payload or length")
			}
		case rWriteImm:
			if h.b == 0 || h.b > MaxBatch || h.payload != stripeSize+h.b*DescSize+immSize || h.a == 0 || h.a > MaxLen {
				return bad("descriptor count, payload or length")
			}
		case rImm:
			if h.b != 0 || h.payload != 0 || h.a > 0xffffffff {
				return bad("immediate fields")
			}
		case rRTS, rSend:
			if h.b != 0 || h.payload != 0 || h.a > MaxLen {
				return bad("send fields")
			}
		case rCTS:
			if h.b != 0 || h.payload != 0 || h.a != 0 {
				return bad("clear-to-send fields")
			}
		default:
			return bad("unknown request")
		}
	case kData:
		if h.sub != 0 || h.status != 0 || h.a != 0 || h.b != 0 || h.payload == 0 || h.payload > ChunkMax {
			return bad("data fields")
		}
	case kResp:
		if h.sub == rWriteImm { // answered as rWrite
			return bad("answer kind")
		}
		if (h.sub == rReadV || h.sub == rWriteV || h.sub == rLease) && h.status == stOK {
			if h.a != 0 || h.b == 0 || h.b > MaxBatch || h.payload != h.b*IovSize || h.sub == rLease && h.b != 1 {
				return bad("grant fields")
			}
			break
		}
		if (h.sub == rReadG || h.sub == rWriteG || h.sub == rLeaseG) && h.status == stOK {
			if h.a != 0 || h.b == 0 || h.b > MaxBatch || h.payload != h.b*IPCRecSize || h.sub == rLeaseG && h.b != 1 {
				return bad("IPC grant fields")
			}
			break
		}
		fallthrough
	case kEnd:
		if h.payload != 0 || h.b != 0 || (h.kind == kEnd && h.sub != 0) || (h.kind == kResp && (h.sub == 0 || h.sub > subLast)) {
			return bad("fields")
		}
		if h.kind == kResp && (h.a > MaxLen || h.a != 0 && (h.sub != rRead || h.status != stOK)) {
			return bad("response length")
		}
		if h.kind == kEnd && (h.status == stOK || h.a != 0) {
			return bad("end without a cause")
		}
	case kRelease, kCancel, kRevoke:
		if h.sub != 0 || h.status != 0 || h.a != 0 || h.b != 0 || h.payload != 0 {
			return bad("release fields")
		}
	case kPing:
		if h.sub != 0 || h.status != 0 || h.id != 0 || h.a != 0 || h.b != 0 || h.payload != 0 {
			return bad("ping fields")
		}
	}
	return h, nil
}

// desc names a range of a remote region, as a request carries it.
type desc struct {
	region, key, off, len uint64
}

func (d *desc) put(p []byte) {
	_ = p[DescSize-1]
	binary.LittleEndian.PutUint64(p[0:], d.region)
	binary.LittleEndian.PutUint64(p[8:], d.key)
	binary.LittleEndian.PutUint64(p[16:], d.off)
	binary.LittleEndian.PutUint64(p[24:], d.len)
}

// decodeDescs parses a read or write request's payload, the stripe's
// start lo and n descriptors, into ds (reused), and checks what can be
// checked without the regions: each length is 1 to MaxLen, each range
// does not overflow, and the stripe [lo, lo+total) lies inside the
// batch's bytes. The regions, keys and bounds are checked by the endpoint
// (Endpoint.acquire).
func decodeDescs(p []byte, n int, total uint64, ds []desc) ([]desc, uint64, error) {
	if n <= 0 || n > MaxBatch || len(p) != stripeSize+n*DescSize {
		return ds, 0, fmt.Errorf("%w: %d descriptors in %d bytes", ErrFrame, n, len(p))
	}
	lo := binary.LittleEndian.Uint64(p)
	p = p[stripeSize:]
	ds = ds[:0]
	var sum uint64
	for i := range n {
		q := p[i*DescSize:]
		d := desc{binary.LittleEndian.Uint64(q[0:]), binary.LittleEndian.Uint64(q[8:]), binary.LittleEndian.Uint64(q[16:]), binary.LittleEndian.Uint64(q[24:])}
		if d.len == 0 || d.len > MaxLen || d.off > MaxLen {
			return ds, 0, fmt.Errorf("%w: descriptor %d: offset %d length %d", ErrFrame, i, d.off, d.len)
		}
		sum += d.len
		if sum > MaxLen {
			return ds, 0, fmt.Errorf("%w: descriptors total more than %d bytes", ErrFrame, uint64(MaxLen))
		}
		ds = append(ds, d)
	}
	if lo > sum || total > sum-lo {
		return ds, 0, fmt.Errorf("%w: a stripe of %d bytes at %d of a batch of %d", ErrFrame, total, lo, sum)
	}
	return ds, lo, nil
}

// ipcRec is one range of an IPC grant (see rReadG): n bytes at off in
// the allocation that handle h maps.
type ipcRec struct {
	h      [kernels.IPCHandleBytes]byte
	off, n uint64
}

func (r *ipcRec) put(p []byte) {
	_ = p[IPCRecSize-1]
	copy(p, r.h[:])
	binary.LittleEndian.PutUint64(p[kernels.IPCHandleBytes:], r.off)
	binary.LittleEndian.PutUint64(p[kernels.IPCHandleBytes+8:], r.n)
}

// decodeIPCGrant parses an IPC grant's n records into rs (reused) and
// checks what can be checked before a handle is opened: each length is 1
// to MaxLen, each offset at most MaxLen, and the lengths add up to the
// request's total. Whether a range lies inside its allocation is checked
// once the handle is opened (the allocation's size is the driver's word,
// not the peer's).
func decodeIPCGrant(p []byte, n int, total uint64, rs []ipcRec) ([]ipcRec, error) {
	if n <= 0 || n > MaxBatch || len(p) != n*IPCRecSize {
		return rs, fmt.Errorf("%w: %d IPC records in %d bytes", ErrFrame, n, len(p))
	}
	rs = rs[:0]
	var sum uint64
	for i := range n {
		q := p[i*IPCRecSize:]
		var r ipcRec
		copy(r.h[:], q)
		r.off = binary.LittleEndian.Uint64(q[kernels.IPCHandleBytes:])
		r.n = binary.LittleEndian.Uint64(q[kernels.IPCHandleBytes+8:])
		if r.n == 0 || r.n > MaxLen || r.off > MaxLen {
			return rs, fmt.Errorf("%w: IPC record %d: offset %d length %d", ErrFrame, i, r.off, r.n)
		}
		sum += r.n
		rs = append(rs, r)
	}
	if sum != total {
		return rs, fmt.Errorf("%w: an IPC grant of %d bytes for a request of %d", ErrFrame, sum, total)
	}
	return rs, nil
}
