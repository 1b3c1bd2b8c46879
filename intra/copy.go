package intra

import "runtime"

// Copy pieces. The Go runtime's memmove switches to non-temporal stores for
// copies of 1 MiB and more. That suits copies larger than the caches, but a
// block of a few MiB that the reader (or the caller) touches next is better
// left in the cache: a 1 MiB block copied whole, with stores that bypass
// the cache, took far more than twice as long as a 512 KiB one copied
// through it (figures in docs/PERFORMANCE.md). So blocks below bigCopy are
// copied in cachePiece pieces, under the runtime's threshold. Blocks from
// bigCopy up are copied whole, with non-temporal stores; or, when the group
// shares its cores with network transfers (yield), in streamPiece pieces
// that yield the processor between them, so that a long copy lets the
// goroutines feeding the network run. The yield is only for that case:
// across nodes it raised large messages' bandwidth, while within a node,
// with no network to feed, it only slowed the copy (docs/PERFORMANCE.md).
const (
	cachePiece  = 512 << 10
	streamPiece = 1 << 20
)

// copyBlock copies src into dst (same length) by the rule above.
func copyBlock(dst, src []byte, bigCopy int, yield bool) {
	n := len(src)
	piece := cachePiece
	if n >= bigCopy {
		if !yield {
			copy(dst, src)
			return
		}
		piece = streamPiece
	}
	if n <= piece {
		copy(dst, src)
		return
	}
	for off := 0; off < n; off += piece {
		end := min(off+piece, n)
		copy(dst[off:end], src[off:end])
		if piece == streamPiece {
			runtime.Gosched()
		}
	}
}
