package overlap

import (
	"fmt"
	"testing"
)

// Every row of every rank is computed exactly once, and no task runs
// before the gather piece that brings its rows.
func TestSchedule(t *testing.T) {
	for _, P := range []int{1, 2, 3, 7} {
		for _, m := range []int{0, 1, 5, 64, 101} {
			for _, n := range []int{1, 2, 3, 8} {
				t.Run(fmt.Sprintf("P%d/m%d/pieces%d", P, m, n), func(t *testing.T) {
					ps := Pieces(m, n)
					next := 0
					for _, p := range ps {
						if p.Lo != next || p.Hi <= p.Lo {
							t.Fatalf("pieces %v do not tile %d rows", ps, m)
						}
						next = p.Hi
					}
					if next != m {
						t.Fatalf("pieces %v end at %d, not %d", ps, next, m)
					}
					for me := range P {
						done := make([][]int, P)
						for r := range done {
							done[r] = make([]int, m)
						}
						gathered := -1 // pieces complete so far, in order
						for _, task := range Tasks(P, me, m, ps) {
							if task.Piece >= 0 {
								if task.Piece > gathered+1 {
									t.Fatalf("task %+v before piece %d", task, gathered+1)
								}
								gathered = max(gathered, task.Piece)
								if task.Lo != ps[task.Piece].Lo || task.Hi != ps[task.Piece].Hi {
									t.Fatalf("task %+v does not match its piece", task)
								}
							} else if task.Rank != me {
								t.Fatalf("task %+v needs no gather but is not this rank's", task)
							}
							for row := task.Lo; row < task.Hi; row++ {
								done[task.Rank][row]++
							}
						}
						for r := range P {
							for row, c := range done[r] {
								if c != 1 {
									t.Fatalf("rank %d: row %d of rank %d computed %d times", me, row, r, c)
								}
							}
						}
					}
				})
			}
		}
	}
}

func TestPieceCount(t *testing.T) {
	for _, tc := range []struct{ n, block, min, want int }{
		{4, 8 << 20, 2 << 20, 4}, // pieces of 2 MiB: as asked
		{4, 4 << 20, 2 << 20, 2}, // fewer, larger pieces
		{4, 1 << 20, 2 << 20, 1}, // the block is less than a piece
		{4, 0, 2 << 20, 1},
		{8, 1 << 20, 0, 8},  // one node: as asked
		{8, 1 << 20, -1, 8}, // no least (Options.MinPieceBytes < 0)
		{0, 1 << 20, 0, 1},
	} {
		if got := PieceCount(tc.n, tc.block, tc.min); got != tc.want {
			t.Errorf("PieceCount(%d, %d, %d) = %d, want %d", tc.n, tc.block, tc.min, got, tc.want)
		}
	}
}
