package pattern

import "testing"

func TestFillCheck(t *testing.T) {
	for _, n := range []int{0, 1, 7, 8, 9, 4095, 4096, 4097, 100_003} {
		b := make([]byte, n)
		Fill(b, 42)
		if i := Check(b, 42); i != -1 {
			t.Fatalf("n=%d: Check found a difference at %d", n, i)
		}
		if n > 0 {
			zeros := 0
			for _, c := range b {
				if c == 0 {
					zeros++
				}
			}
			if n > 64 && zeros > n/16 {
				t.Fatalf("n=%d: %d zero bytes", n, zeros)
			}
			b[n/2] ^= 1
			if i := Check(b, 42); i != n/2 {
				t.Fatalf("n=%d: corruption at %d reported at %d", n, n/2, i)
			}
			if Check(b[:n/2], 43) == -1 && n > 16 {
				t.Fatal("another seed's stream matched")
			}
		}
	}
}

func TestPrefix(t *testing.T) {
	a, b := make([]byte, 13), make([]byte, 100)
	Fill(a, 7)
	Fill(b, 7)
	for i := range 8 { // whole words agree
		if a[i] != b[i] {
			t.Fatal("prefix differs")
		}
	}
}

func TestSeedsDiffer(t *testing.T) {
	seen := map[uint64]bool{}
	for r := range 64 {
		for it := range 100 {
			s := Seed(r, it, 0)
			if seen[s] {
				t.Fatalf("seed collision at rank %d iter %d", r, it)
			}
			seen[s] = true
		}
	}
}
