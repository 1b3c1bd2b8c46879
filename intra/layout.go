package intra

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"unsafe"
)

const (
	lineBytes   = 64
	pageBytes   = 4096
	headerBytes = 16384
	// InlineBytes is the largest message that travels inside the header
	// lines, so that a reader learns of it and reads it in one transfer.
	InlineBytes = headerBytes - headerFixed
	headerFixed = 40

	segMagic = 0x736c696d65676f31 // "slimego1"
	// segVersion 2: the identity names the kind, the size and the job.
	segVersion = 2
)

// ctrl is a rank's control line.
type ctrl struct {
	bell     uint32 // futex word: rung by peers when this rank sleeps
	sleeping uint32 // nonzero while the rank may be asleep on bell
	state    uint32 // stateAlive, stateClosed, stateFailed
	pid      uint32
	self     uint64 // address of pid in this rank's own address space
	cmaOK    uint32 // this rank can read every peer's memory (process_vm_readv)
	// blame is the global rank + 1 of the peer that this rank's failure
	// named as lost or late (0: none), stored before state: a rank waiting
	// for this one names that peer, not this rank that gave up on it.
	blame uint32
	_     [lineBytes - 32]byte
}

const (
	stateAlive uint32 = iota + 1
	stateClosed
	stateFailed
)

// header announces one rank's part of one call. epoch is stored last.
type header struct {
	epoch  uint64
	size   uint64
	hash   uint64 // operation and, for AllGatherV, the counts vector
	zcBuf  uint32 // symmetric buffer id + 1 (modeSymmetric)
	mode   uint32 // how readers get the data
	zcOff  uint64 // offset in the symmetric buffer, or the source address (modeCMA)
	inline [InlineBytes]byte
}

// How a block travels from its owner to the readers.
const (
	// modeStaged: inline in the header, or through the owner's ring.
	modeStaged uint32 = iota
	// modeSymmetric: read in place from the owner's symmetric buffer.
	modeSymmetric
	// modeCMA: read straight from the owner's memory with
	// process_vm_readv (cross-memory attach), one copy in the kernel.
	modeCMA
)

// ackLine is what a reader publishes about one owner.
type ackLine struct {
	consumed uint64 // chunks of the owner's ring consumed, ever
	ack      uint64 // last epoch whose data from the owner is fully read
	_        [lineBytes - 16]byte
}

// layout gives the offsets of everything in a segment for L ranks, a ring of
// K slots of C bytes each.
type layout struct {
	L, K, C    int
	ctrlOff    int
	headerOff  int
	ackOff     int
	slotOff    int
	slotStride int // bytes per slot: one line for the stamp, then C bytes
	rankSlots  int // bytes of one rank's ring, page aligned
	total      int
}

func newLayout(L, K, C int) (layout, error) {
	if L < 1 || K < 2 || C < lineBytes || C%lineBytes != 0 {
		return layout{}, fmt.Errorf("bad segment geometry: %d ranks, %d slots of %d bytes", L, K, C)
	}
	// A segment whose size does not fit in an int would wrap round to a
	// small one that the offsets below run past: refuse it. (The limit
	// leaves room for the roundings; ranks per node are far fewer.)
	const limit = math.MaxInt / 4
	if L > 1<<20 || C > limit-lineBytes || K > limit/(lineBytes+C) ||
		L > limit/(roundUp(K*(lineBytes+C), pageBytes)+2*headerBytes) {
		return layout{}, fmt.Errorf("segment geometry of %d ranks, %d slots of %d bytes does not fit in memory", L, K, C)
	}
	l := layout{L: L, K: K, C: C}
	l.ctrlOff = pageBytes
	l.headerOff = l.ctrlOff + roundUp(L*lineBytes, lineBytes)
	l.ackOff = l.headerOff + L*2*headerBytes
	l.slotOff = roundUp(l.ackOff+L*L*lineBytes, pageBytes)
	l.slotStride = lineBytes + C
	l.rankSlots = roundUp(K*l.slotStride, pageBytes)
	l.total = l.slotOff + L*l.rankSlots
	return l, nil
}

func roundUp(n, m int) int { return (n + m - 1) / m * m }

// SlotBytes is the slot size of a group whose Config.SlotBytes is n:
// DefaultSlotBytes for n <= 0, else n rounded up to a cache line. Ranks
// whose settings give the same one lay out their shared memory alike.
// (A size past what rounds without overflow is left as it is, for
// newLayout to refuse.)
func SlotBytes(n int) int {
	switch {
	case n <= 0:
		return DefaultSlotBytes
	case n > math.MaxInt-lineBytes:
		return n
	}
	return roundUp(n, lineBytes)
}

// identity is the first bytes of every segment: what it is, its geometry,
// its size, and which group made it (a hash of the group's ShmPrefix, which
// names the job, the attempt and the communicator). An opener checks it on
// the first page before it maps the rest, so that a file some other client
// named in the store, or another job's segment, is refused.
type identity struct {
	kind    uint32 // kindGroup or kindBuffer
	a, b, c uint32 // ranks, slots, slot bytes; or ranks, buffer id, stride in pages
	job     uint64
	total   uint64 // bytes of the whole segment
}

const (
	kindGroup  = 1
	kindBuffer = 2
)

func (id identity) write(mem []byte) {
	binary.LittleEndian.PutUint64(mem[0:], segMagic)
	binary.LittleEndian.PutUint32(mem[8:], segVersion)
	binary.LittleEndian.PutUint32(mem[12:], id.kind)
	binary.LittleEndian.PutUint32(mem[16:], id.a)
	binary.LittleEndian.PutUint32(mem[20:], id.b)
	binary.LittleEndian.PutUint32(mem[24:], id.c)
	binary.LittleEndian.PutUint64(mem[32:], id.job)
	binary.LittleEndian.PutUint64(mem[40:], id.total)
}

func readIdentity(mem []byte) (id identity, err error) {
	if len(mem) < identityBytes {
		return id, fmt.Errorf("segment header holds %d bytes, want %d", len(mem), identityBytes)
	}
	if binary.LittleEndian.Uint64(mem[0:]) != segMagic || binary.LittleEndian.Uint32(mem[8:]) != segVersion {
		return id, fmt.Errorf("segment is not a slimego v%d segment", segVersion)
	}
	id.kind = binary.LittleEndian.Uint32(mem[12:])
	id.a = binary.LittleEndian.Uint32(mem[16:])
	id.b = binary.LittleEndian.Uint32(mem[20:])
	id.c = binary.LittleEndian.Uint32(mem[24:])
	id.job = binary.LittleEndian.Uint64(mem[32:])
	id.total = binary.LittleEndian.Uint64(mem[40:])
	return id, nil
}

// check says whether the header in mem is exactly want.
func (want identity) check(mem []byte) error {
	got, err := readIdentity(mem)
	if err != nil {
		return err
	}
	if got.job != want.job {
		return fmt.Errorf("segment belongs to another job or communicator (identity %#x, want %#x)", got.job, want.job)
	}
	if got != want {
		return fmt.Errorf("segment kind %d geometry %d × %d × %d of %d bytes, want kind %d %d × %d × %d of %d bytes",
			got.kind, got.a, got.b, got.c, got.total, want.kind, want.a, want.b, want.c, want.total)
	}
	return nil
}

const identityBytes = 48

// jobHash is the 64-bit FNV-1a hash of a group's ShmPrefix.
func jobHash(prefix string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(prefix))
	return h.Sum64()
}

func (l layout) identity(job uint64) identity {
	return identity{kind: kindGroup, a: uint32(l.L), b: uint32(l.K), c: uint32(l.C), job: job, total: uint64(l.total)}
}

// writeIdentity stamps the segment so that an opener can check it maps what
// it expects, made by the group it expects.
func (l layout) writeIdentity(mem []byte, job uint64) { l.identity(job).write(mem) }

// checkIdentity checks the header (the first page of the segment suffices).
func (l layout) checkIdentity(mem []byte, job uint64) error { return l.identity(job).check(mem) }

func (l layout) ctrl(mem []byte, r int) *ctrl {
	return (*ctrl)(unsafe.Pointer(&mem[l.ctrlOff+r*lineBytes]))
}

func (l layout) header(mem []byte, r, parity int) *header {
	return (*header)(unsafe.Pointer(&mem[l.headerOff+(r*2+parity)*headerBytes]))
}

// ack is reader r's line about owner o.
func (l layout) ack(mem []byte, reader, owner int) *ackLine {
	return (*ackLine)(unsafe.Pointer(&mem[l.ackOff+(reader*l.L+owner)*lineBytes]))
}

// slot returns the stamp word and the data area of slot k of rank r's ring.
func (l layout) slot(mem []byte, r, k int) (*uint64, []byte) {
	off := l.slotOff + r*l.rankSlots + k*l.slotStride
	return (*uint64)(unsafe.Pointer(&mem[off])), mem[off+lineBytes : off+lineBytes+l.C : off+lineBytes+l.C]
}

func init() {
	if unsafe.Sizeof(ctrl{}) != lineBytes || unsafe.Sizeof(header{}) != headerBytes || unsafe.Sizeof(ackLine{}) != lineBytes {
		panic("intra: shared-memory structures have the wrong size")
	}
}
