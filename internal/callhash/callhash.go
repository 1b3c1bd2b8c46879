// Package callhash fingerprints a collective call (its operation and every
// rank's size) so that ranks can tell, from one word, whether they are
// making the same call. It allocates nothing.
package callhash

const (
	offset64 = 14695981039346656037
	prime64  = 1099511628211
)

// Sum is FNV-1a over the operation's name and the sizes, each as eight
// little-endian bytes.
func Sum(op string, sizes []int) uint64 {
	h := uint64(offset64)
	for i := 0; i < len(op); i++ {
		h ^= uint64(op[i])
		h *= prime64
	}
	for _, n := range sizes {
		v := uint64(n)
		for range 8 {
			h ^= v & 0xff
			h *= prime64
			v >>= 8
		}
	}
	return h
}
