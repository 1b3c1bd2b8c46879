package intra

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/slimego/slimego/kernels"
)

// hostMem stands in for device addresses in the plan's arithmetic: each
// allocation is a byte slice at a made-up base address.
type hostMem struct {
	next  kernels.Ptr
	bases []kernels.Ptr
	bufs  [][]byte
}

func (m *hostMem) alloc(n int) kernels.Ptr {
	if m.next == 0 {
		m.next = 1 << 40
	}
	p := m.next
	m.next += kernels.Ptr(n+4096) &^ 4095
	m.bases, m.bufs = append(m.bases, p), append(m.bufs, make([]byte, n))
	return p
}

// at is the n bytes at address p, which must lie inside one allocation.
func (m *hostMem) at(t *testing.T, p kernels.Ptr, n uint64) []byte {
	t.Helper()
	if n == 0 {
		return nil // the kernel touches nothing: an address past the end is fine
	}
	for i, b := range m.bases {
		if p >= b && uint64(p-b)+n <= uint64(len(m.bufs[i])) {
			return m.bufs[i][p-b : uint64(p-b)+n]
		}
	}
	t.Fatalf("address %#x (+%d) is outside every allocation", p, n)
	return nil
}

// runLL executes one round of every rank's plan as allgather_ll_kernel
// does (kernels/slime.cu), with host memory: push into every peer's slot,
// raise the flags, copy the own block, then read each source's slot after
// checking its flag and announced total.
func runLL(t *testing.T, m *hostMem, args []*kernels.AllGatherArgs, epoch uint64) {
	t.Helper()
	P := len(args)
	slot := epoch & 1
	for _, a := range args {
		n := min(a.Bytes, a.Cap)
		src := m.at(t, a.Src, n)
		for i := 1; i < P; i++ {
			p := (int(a.Rank) + i) % P
			copy(m.at(t, a.Scratch[p]+kernels.Ptr((slot*uint64(P)+uint64(a.Rank))*a.Cap), n), src)
			f := m.at(t, a.Flags[p]+kernels.Ptr((slot*uint64(P)+uint64(a.Rank))*16), 16)
			putU64(f[8:], a.Total)
			putU64(f, epoch)
		}
		copy(m.at(t, a.Dst+kernels.Ptr(a.Off[a.Rank]), a.Expect[a.Rank]), src)
	}
	for _, a := range args {
		r := uint64(a.Rank)
		for s := 0; s < P; s++ {
			if s == int(r) {
				continue
			}
			f := m.at(t, a.Flags[r]+kernels.Ptr((slot*uint64(P)+uint64(s))*16), 16)
			if getU64(f) != epoch || getU64(f[8:]) != a.Totals[s] {
				t.Fatalf("rank %d: flag from %d says epoch %d total %d, want %d and %d", r, s, getU64(f), getU64(f[8:]), epoch, a.Totals[s])
			}
			from := m.at(t, a.Scratch[r]+kernels.Ptr((slot*uint64(P)+uint64(s))*a.Cap), a.Expect[s])
			copy(m.at(t, a.Dst+kernels.Ptr(a.Off[s]), a.Expect[s]), from)
		}
	}
}

func putU64(b []byte, v uint64) {
	for i := range 8 {
		b[i] = byte(v >> (8 * i))
	}
}

func getU64(b []byte) uint64 {
	var v uint64
	for i := range 8 {
		v |= uint64(b[i]) << (8 * i)
	}
	return v
}

// The GPU plan's rounds, offsets and sizes, run through a host model of the
// kernel, gather every rank's bytes to their places: uneven blocks, empty
// ones, blocks of many rounds and of exactly the scratch size.
func TestGPUPlanRounds(t *testing.T) {
	for _, tc := range []struct {
		cap   int
		sizes []int
	}{
		{1024, []int{3000, 0, 1024, 1}},
		{256, []int{256, 256}},
		{4096, []int{7}},
		{512, []int{0, 0, 0}},
		{256, []int{5000, 4999, 1, 256, 257, 0, 100, 2048}},
	} {
		t.Run(fmt.Sprintf("cap%d/%v", tc.cap, tc.sizes), func(t *testing.T) {
			P := len(tc.sizes)
			m := &hostMem{}
			groups := make([]*GPUGroup, P)
			for r := range P {
				g := &GPUGroup{cfg: GPUConfig{Rank: r, Size: P, Ranks: make([]int, P), Blocks: 16}, cap: align256(uint64(tc.cap))}
				g.region = m.alloc(int(g.regionBytes()))
				g.counters = m.alloc(kernels.CounterBytes)
				groups[r] = g
			}
			for _, g := range groups {
				g.peers = make([]kernels.Ptr, P)
				for s := range P {
					g.peers[s] = groups[s].region
				}
			}
			offs := make([]int, P)
			total := 0
			for r, n := range tc.sizes {
				offs[r] = total
				total += n
			}
			rng := rand.New(rand.NewPCG(uint64(P), 3))
			want := make([]byte, total)
			for i := range want {
				want[i] = byte(rng.Uint32())
			}
			plans := make([]*GPUPlan, P)
			dsts := make([]kernels.Ptr, P)
			for r, g := range groups {
				dsts[r] = m.alloc(total)
				src := m.alloc(tc.sizes[r])
				copy(m.at(t, src, uint64(tc.sizes[r])), want[offs[r]:offs[r]+tc.sizes[r]])
				p, err := g.Plan(dsts[r], src, tc.sizes, offs)
				if err != nil {
					t.Fatal(err)
				}
				if p.blocks < 1 || p.blocks > 16 {
					t.Errorf("rank %d: %d thread blocks", r, p.blocks)
				}
				plans[r] = p
			}
			rounds := len(plans[0].rounds)
			for _, p := range plans {
				if len(p.rounds) != rounds {
					t.Fatalf("ranks plan %d and %d rounds", rounds, len(p.rounds))
				}
			}
			// Run the plan twice: the epochs (and slots) move on.
			for call := range 2 {
				for j := range rounds {
					args := make([]*kernels.AllGatherArgs, P)
					for r := range P {
						args[r] = &plans[r].rounds[j]
						if args[r].Bytes > args[r].Cap {
							t.Fatalf("round %d, rank %d: %d bytes in a %d-byte slot", j, r, args[r].Bytes, args[r].Cap)
						}
					}
					runLL(t, m, args, uint64(call*rounds+j+1))
				}
				for r := range P {
					if got := m.at(t, dsts[r], uint64(total)); !bytes.Equal(got, want) {
						t.Fatalf("call %d, rank %d: gathered bytes differ", call, r)
					}
				}
			}
		})
	}
}
