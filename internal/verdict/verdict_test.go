package verdict

import (
	"fmt"
	"testing"
)

func TestDiffers(t *testing.T) {
	same := func(a, b int) bool { return a == b }
	describe := func(a int, ra []int, b int, rb []int) string {
		return fmt.Sprintf("%s %d, %s %d", RankList(ra), a, RankList(rb), b)
	}
	for _, tc := range []struct {
		xs     []int
		me     int
		peer   int
		detail string
	}{
		{[]int{4, 4, 4}, 0, -1, ""},
		{[]int{4, 5, 4}, 0, 1, "rank 1 5, ranks 0 and 2 4"},
		{[]int{4, 5, 4}, 1, 0, "rank 1 5, ranks 0 and 2 4"},
		{[]int{4, 5}, 0, 1, "rank 1 5, rank 0 4"}, // a tie: rank 0's is the reference
		{[]int{5, 4, 4, 4, 6}, 2, 0, "rank 0 5, ranks 1-3 4; rank 4 6, ranks 1-3 4"},
	} {
		peer, detail := Differs(tc.xs, tc.me, same, describe)
		if peer != tc.peer || detail != tc.detail {
			t.Errorf("Differs(%v, me %d) = %d, %q; want %d, %q", tc.xs, tc.me, peer, detail, tc.peer, tc.detail)
		}
	}
}

func TestRankList(t *testing.T) {
	for _, tc := range []struct {
		in   []int
		want string
	}{
		{[]int{3}, "rank 3"},
		{[]int{0, 2}, "ranks 0 and 2"},
		{[]int{0, 1, 2, 5, 7}, "ranks 0-2, 5 and 7"},
		{[]int{0, 1, 3, 4}, "ranks 0, 1, 3 and 4"},
	} {
		if got := RankList(tc.in); got != tc.want {
			t.Errorf("RankList(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
