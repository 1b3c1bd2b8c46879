package intra

// The Go runtime's memmove switches to non-temporal stores for copies of
// 1 MiB and more. That suits copies larger than the caches, but a block of
// a few MiB that the reader (or the caller) touches next is better left in
// the cache: measured with two ranks on the development machines, a 1 MiB
// block copied whole took 4.6 times as long as a 512 KiB one. So blocks
// below bigCopy are copied in pieces under the runtime's threshold.
const copyPiece = 512 << 10

// copyBlock copies src into dst (same length) and reports nothing: it is
// copy with the piece rule above.
func copyBlock(dst, src []byte, bigCopy int) {
	n := len(src)
	if n < copyPiece || n >= bigCopy {
		copy(dst, src)
		return
	}
	for off := 0; off < n; off += copyPiece {
		end := min(off+copyPiece, n)
		copy(dst[off:end], src[off:end])
	}
}
