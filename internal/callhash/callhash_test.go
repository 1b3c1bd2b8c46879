package callhash

import (
	"encoding/binary"
	"hash/fnv"
	"testing"
)

func TestSumIsFNV1a(t *testing.T) {
	for _, tc := range []struct {
		op    string
		sizes []int
	}{{"", nil}, {"allgather", []int{8, 8}}, {"allgatherv", []int{0, 1 << 40, 7}}} {
		h := fnv.New64a()
		h.Write([]byte(tc.op))
		for _, n := range tc.sizes {
			h.Write(binary.LittleEndian.AppendUint64(nil, uint64(n)))
		}
		if got, want := Sum(tc.op, tc.sizes), h.Sum64(); got != want {
			t.Errorf("Sum(%q, %v) = %x, want %x", tc.op, tc.sizes, got, want)
		}
	}
	if Sum("allgather", []int{8, 8}) == Sum("allgatherv", []int{8, 8}) || Sum("a", []int{1, 2}) == Sum("a", []int{2, 1}) {
		t.Error("different calls share a fingerprint")
	}
	if n := testing.AllocsPerRun(10, func() { Sum("allgather", []int{1, 2, 3}) }); n != 0 {
		t.Errorf("Sum allocates %v times", n)
	}
}
