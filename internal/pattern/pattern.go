// Package pattern fills buffers with reproducible pseudo-random bytes, so
// that every rank can compute what any other rank sent and check a
// gathered result byte for byte. It is fast enough for 64 MiB buffers.
package pattern

import (
	"encoding/binary"
	"unsafe"
)

// Seed derives the seed of one rank's block in one iteration.
func Seed(rank, iter int, salt uint64) uint64 {
	return mix(uint64(rank)*0x9e3779b97f4a7c15 ^ uint64(iter)*0xbf58476d1ce4e5b9 ^ salt)
}

func mix(z uint64) uint64 {
	z += 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// Fill writes the stream of seed into b. A prefix of a longer fill equals
// the shorter fill.
func Fill(b []byte, seed uint64) {
	s := seed
	n := len(b) &^ 7
	if n > 0 {
		words := unsafe.Slice((*uint64)(unsafe.Pointer(&b[0])), n/8)
		for i := range words {
			s += 0x9e3779b97f4a7c15
			z := (s ^ (s >> 30)) * 0xbf58476d1ce4e5b9
			z = (z ^ (z >> 27)) * 0x94d049bb133111eb
			words[i] = z ^ (z >> 31)
		}
	}
	if rest := len(b) - n; rest > 0 {
		s += 0x9e3779b97f4a7c15
		z := (s ^ (s >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], z^(z>>31))
		copy(b[n:], w[:rest])
	}
}

// Check returns the index of the first byte of b that differs from the
// stream of seed, or -1.
func Check(b []byte, seed uint64) int {
	var buf [4096]byte
	for off := 0; off < len(b); off += len(buf) {
		chunk := b[off:min(off+len(buf), len(b))]
		// The stream at word off/8 continues from seed + (off/8) steps.
		Fill(buf[:len(chunk)], seed+uint64(off/8)*0x9e3779b97f4a7c15)
		for i := range chunk {
			if chunk[i] != buf[i] {
				return off + i
			}
		}
	}
	return -1
}
