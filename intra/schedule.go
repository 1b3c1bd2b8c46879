package intra

// The schedule: how one owner's block is cut into ring chunks. Owner and
// readers compute it independently from the block's size and the segment's
// geometry, so it must be a pure function of both.

const minChunk = 16 << 10

// chunking returns the chunk length and count for a block of n bytes sent
// through slots of capacity c. Blocks of up to InlineBytes travel in the
// header (no chunks). Others are cut into at least pipelineDepth chunks (so
// that the owner's copy-in and the readers' copy-out overlap) of at most c
// bytes and at least minChunk, in whole cache lines.
func chunking(n, c int) (chunk, count int) {
	if n <= InlineBytes {
		return 0, 0
	}
	const pipelineDepth = 4
	chunk = roundUp((n+pipelineDepth-1)/pipelineDepth, lineBytes)
	chunk = max(min(chunk, c), min(minChunk, c))
	return chunk, (n + chunk - 1) / chunk
}
