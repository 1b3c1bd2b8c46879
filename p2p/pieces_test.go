package p2p

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"
)

// TestAppendPiece: a piece that follows the last one in the same array
// joins it; one that does not (a gap, another order, past the last
// piece's capacity) is a piece of its own.
func TestAppendPiece(t *testing.T) {
	a := make([]byte, 64)
	other := make([]byte, 64)
	cases := []struct {
		name  string
		in    [][]byte
		b     []byte
		want  int // pieces after
		first int // the first piece's length after
	}{
		{"first", nil, a[0:8], 1, 8},
		{"back to back", [][]byte{a[0:8]}, a[8:16], 1, 16},
		{"a gap", [][]byte{a[0:8]}, a[9:16], 2, 8},
		{"before", [][]byte{a[8:16]}, a[0:8], 2, 8},
		{"overlapping", [][]byte{a[0:8]}, a[4:12], 2, 8},
		{"another array", [][]byte{a[0:8]}, other[0:8], 2, 8},
		{"past the capacity", [][]byte{a[0:8:8]}, a[8:16], 2, 8},
		{"capacity ends with it", [][]byte{a[0:8:16]}, a[8:16], 1, 16},
		{"empty", [][]byte{a[0:8]}, a[8:8], 2, 8},
	}
	for _, c := range cases {
		in := len(c.b)
		for _, p := range c.in {
			in += len(p)
		}
		got := appendPiece(c.in, c.b)
		if len(got) != c.want || len(got[0]) != c.first {
			t.Errorf("%s: %d pieces, the first of %d bytes; want %d, %d", c.name, len(got), len(got[0]), c.want, c.first)
		}
		n := 0
		for _, p := range got {
			n += len(p)
		}
		if n != in {
			t.Errorf("%s: %d bytes in the pieces, want %d", c.name, n, in)
		}
	}
	// The joined piece is the same memory, not a copy.
	got := appendPiece([][]byte{a[0:8]}, a[8:16])
	if unsafe.SliceData(got[0]) != &a[0] {
		t.Error("the joined piece is not the array's memory")
	}
}

// TestBatchRuns: batches whose pages lie partly back to back (on either
// side, on both, and across two adjacent regions carved from one buffer)
// and partly scattered, written and read back over every transport,
// checked byte for byte against a model of both memories.
func TestBatchRuns(t *testing.T) { transports(t, testBatchRuns) }

func testBatchRuns(t *testing.T, tcpOnly bool, wantT string) {
	a, b, ab, _ := pair(t, func(o *Options) { o.TCPOnly = tcpOnly })
	ctx := ctxT(t, 60*time.Second)
	const page, pages = 16 << 10, 96
	local := make([]byte, page*pages)
	back := make([]byte, page*pages)
	lr, err := a.Register("local", local)
	if err != nil {
		t.Fatal(err)
	}
	br, err := a.Register("back", back)
	if err != nil {
		t.Fatal(err)
	}
	// The target's memory: two regions side by side in one buffer.
	far := make([]byte, page*pages)
	half := page * pages / 2
	r1, err := b.Register("low", far[:half])
	if err != nil {
		t.Fatal(err)
	}
	r2, err := b.Register("high", far[half:])
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 11))
	for round := range 8 {
		// Remote pages: a run across the regions' boundary, then the
		// rest in a random order; local pages: in order for the first
		// half of the batch, scattered after.
		remote := rng.Perm(pages)
		run := half/page - 4
		for i := range 8 {
			j := 0
			for remote[j] != run+i {
				j++
			}
			remote[i], remote[j] = remote[j], remote[i]
		}
		localAt := append([]int(nil), rng.Perm(pages)...)
		for i := range pages / 2 {
			localAt[i] = i
		}
		seen := map[int]bool{}
		for i := range pages / 2 {
			seen[i] = true
		}
		k := pages / 2
		for i := range pages {
			if !seen[i] {
				localAt[k] = i
				k++
			}
		}
		rng.Shuffle(pages-pages/2, func(i, j int) {
			localAt[pages/2+i], localAt[pages/2+j] = localAt[pages/2+j], localAt[pages/2+i]
		})
		n := 1 + rng.IntN(pages)
		ops := func(mem *Region) []Op {
			var out []Op
			for i := range n {
				rr, off := r1, remote[i]*page
				if off >= half {
					rr, off = r2, off-half
				}
				out = append(out, Op{Local: mem, LocalOff: localAt[i] * page, Remote: rr.Remote(), RemoteOff: off, Len: page})
			}
			return out
		}
		fill(local, uint64(round)+100)
		want := bytes.Clone(far)
		for i := range n {
			copy(want[remote[i]*page:(remote[i]+1)*page], local[localAt[i]*page:(localAt[i]+1)*page])
		}
		f := ab.Write(ops(lr))
		if err := f.Wait(ctx); err != nil {
			t.Fatalf("round %d: write of %d pages: %v", round, n, err)
		}
		if !bytes.Equal(far, want) {
			t.Fatalf("round %d: write of %d pages: the target's memory differs at byte %s", round, n, firstDiff(far, want))
		}
		clear(back)
		wantBack := make([]byte, len(back))
		for i := range n {
			copy(wantBack[localAt[i]*page:(localAt[i]+1)*page], far[remote[i]*page:(remote[i]+1)*page])
		}
		f = ab.Read(ops(br))
		if err := f.Wait(ctx); err != nil {
			t.Fatalf("round %d: read of %d pages: %v", round, n, err)
		}
		if !bytes.Equal(back, wantBack) {
			t.Fatalf("round %d: read of %d pages: differs at byte %s", round, n, firstDiff(back, wantBack))
		}
		if n*page > cmaMin && f.Transport() != wantT {
			t.Fatalf("round %d: transport %q, want %q", round, f.Transport(), wantT)
		}
	}
}

func firstDiff(a, b []byte) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprint(i)
		}
	}
	return fmt.Sprintf("end (%d, %d)", len(a), len(b))
}
