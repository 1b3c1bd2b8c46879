package inter

import (
	"fmt"
	"testing"
)

// TestRailSchedule simulates the hierarchical schedule for many layouts:
// after the exchange and the intra-node gathers in NodeOrder, every rank
// holds every block exactly once, and inter-node traffic per rank is N−1
// blocks.
func TestRailSchedule(t *testing.T) {
	for _, nodes := range []int{1, 2, 3, 5} {
		for _, local := range []int{1, 2, 4, 7} {
			t.Run(fmt.Sprintf("%dx%d", nodes, local), func(t *testing.T) {
				P := nodes * local
				have := make([]map[int]int, P)
				for r := range P {
					have[r] = map[int]int{r: 1}
				}
				// Exchange: r sends its own block to each peer; peers are
				// symmetric.
				for r := range P {
					peers := RailPeers(nodes, local, r)
					if len(peers) != nodes-1 {
						t.Fatalf("rank %d: %d peers", r, len(peers))
					}
					for _, p := range peers {
						if p%local != r%local || p/local == r/local {
							t.Fatalf("rank %d peers with %d, not on its rail", r, p)
						}
						have[p][r]++
					}
				}
				// Intra: for node b's blocks, every local rank contributes
				// block (b, its local rank), which it must hold.
				for a := range nodes {
					for _, b := range NodeOrder(nodes, a) {
						for i := range local {
							blk := b*local + i
							if have[a*local+i][blk] == 0 {
								t.Fatalf("node %d gathers block %d before local rank %d holds it", a, blk, i)
							}
						}
						for j := range local {
							for i := range local {
								if i != j {
									have[a*local+j][b*local+i]++
								}
							}
						}
					}
				}
				for r := range P {
					for blk := range P {
						if have[r][blk] != 1 {
							t.Fatalf("rank %d holds block %d %d times", r, blk, have[r][blk])
						}
					}
				}
			})
		}
	}
}

// TestRingSchedule simulates the ring as Ring describes it: every rank
// sends to the next that Ring returns, which must name the sender as its
// previous rank and expect at each step the block the sender forwards; the
// sender holds that block, and after p−1 steps every rank holds every
// block.
func TestRingSchedule(t *testing.T) {
	for _, P := range []int{1, 2, 3, 8, 13} {
		have := make([]map[int]bool, P)
		for r := range P {
			have[r] = map[int]bool{r: true}
		}
		steps := make([][]RingStep, P)
		nexts, prevs := make([]int, P), make([]int, P)
		for r := range P {
			next, prev, s := Ring(P, r)
			if len(s) != P-1 {
				t.Fatalf("P=%d rank %d: %d steps", P, r, len(s))
			}
			if next < 0 || next >= P || prev < 0 || prev >= P || P > 1 && (next == r || prev == r) {
				t.Fatalf("P=%d rank %d: neighbours %d, %d", P, r, next, prev)
			}
			nexts[r], prevs[r], steps[r] = next, prev, s
		}
		for r := range P {
			if P > 1 && prevs[nexts[r]] != r {
				t.Fatalf("P=%d: rank %d sends to %d, whose previous rank is %d", P, r, nexts[r], prevs[nexts[r]])
			}
		}
		if P > 1 {
			// One cycle through every rank.
			seen, r := map[int]bool{}, 0
			for range P {
				seen[r] = true
				r = nexts[r]
			}
			if len(seen) != P || r != 0 {
				t.Fatalf("P=%d: following next from rank 0 visits %d ranks", P, len(seen))
			}
		}
		for s := 0; s < P-1; s++ {
			for r := range P {
				st := steps[r][s]
				if !have[r][st.Send] {
					t.Fatalf("P=%d step %d: rank %d sends block %d it does not hold", P, s, r, st.Send)
				}
				next := nexts[r]
				if steps[next][s].Recv != st.Send {
					t.Fatalf("P=%d step %d: rank %d sends %d, rank %d expects %d", P, s, r, st.Send, next, steps[next][s].Recv)
				}
			}
			for r := range P {
				have[nexts[r]][steps[r][s].Send] = true
			}
		}
		for r := range P {
			if len(have[r]) != P {
				t.Fatalf("P=%d: rank %d ends with %d blocks", P, r, len(have[r]))
			}
		}
		if want := map[int]bool{}; P > 1 {
			for _, q := range RingPeers(P, 0) {
				want[q] = true
			}
			if !want[nexts[0]] || !want[prevs[0]] || len(want) > 2 {
				t.Fatalf("P=%d: RingPeers(0) = %v, want next %d and prev %d", P, RingPeers(P, 0), nexts[0], prevs[0])
			}
		} else if len(RingPeers(P, 0)) != 0 {
			t.Fatalf("P=1: RingPeers = %v", RingPeers(P, 0))
		}
	}
}

func TestStripeCoversEveryByteOnce(t *testing.T) {
	for _, n := range []int{0, 1, DirectMax, StripeMin, StripeMin + 1, 3*StripeMin - 1, 64 << 20} {
		for _, ch := range []int{1, 2, 3, 4} {
			k := Stripes(n, ch)
			want := min(ch, max(1, (n+StripeMin-1)/StripeMin))
			if k != want {
				t.Fatalf("n=%d channels=%d: %d stripes, want %d", n, ch, k, want)
			}
			next := 0
			for c := range k {
				lo, hi := Stripe(n, k, c)
				if lo != next || hi < lo {
					t.Fatalf("n=%d channels=%d: stripe %d is [%d,%d), want it to start at %d", n, ch, c, lo, hi, next)
				}
				if k > 1 && hi-lo < StripeMin/2 {
					t.Fatalf("n=%d channels=%d: stripe %d carries only %d bytes", n, ch, c, hi-lo)
				}
				next = hi
			}
			if next != n {
				t.Fatalf("n=%d channels=%d: stripes end at %d", n, ch, next)
			}
		}
	}
}
