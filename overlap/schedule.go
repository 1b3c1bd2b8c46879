package overlap

// The schedule of one overlapped C = AllGather(A)·B, as pure functions of
// the shape: the gather is cut into pieces (row ranges of every rank's
// block), and the GEMM into tasks (row ranges of one rank's block).

// Piece is a row range [Lo, Hi) of every rank's m-row block.
type Piece struct{ Lo, Hi int }

// Pieces cuts m rows into n pieces as even as they come (fewer when m < n;
// none when m = 0).
func Pieces(m, n int) []Piece {
	n = max(min(n, m), 1)
	if m == 0 {
		return nil
	}
	ps := make([]Piece, n)
	for i := range ps {
		ps[i] = Piece{Lo: i * m / n, Hi: (i + 1) * m / n}
	}
	return ps
}

// Task is a GEMM of rows [Lo, Hi) of rank Rank's block. Piece is the gather
// piece it must wait for, or -1 for this rank's own rows, which need none.
type Task struct {
	Rank, Piece int
	Lo, Hi      int
}

// Tasks is rank me's compute order: its own block first (it needs no
// communication), then piece by piece, in gather order, the other ranks'
// rows, starting with the next rank.
func Tasks(P, me, m int, pieces []Piece) []Task {
	var ts []Task
	if m > 0 {
		ts = append(ts, Task{Rank: me, Piece: -1, Lo: 0, Hi: m})
	}
	for k, p := range pieces {
		for i := 1; i < P; i++ {
			ts = append(ts, Task{Rank: (me + i) % P, Piece: k, Lo: p.Lo, Hi: p.Hi})
		}
	}
	return ts
}
