// Command kvcache is the disaggregated-inference transfer DLSlime exists
// for, on package p2p: prefill ranks write KV-cache pages into the caches
// that decode ranks registered, many small pages per batched call, and
// signal each batch with WriteWithImm; a decode rank checks every byte of
// a batch's pages when the batch's immediate arrives (after the bytes).
//
//	slimerun --standalone --nproc-per-node 4 kvcache --prefill 2
//
// The first --prefill ranks prefill, the others decode. Each prefill rank
// owns every P-th page of each decode rank's cache (P prefill ranks), and
// writes them all in each round, scattered (a permutation of its pages
// that both sides derive), in batches of --batch pages, --inflight batches
// at a time; the immediate is the batch's number. The page data is random,
// different in every round, and each side computes it (internal/pattern).
// Rounds are separated by a barrier in the store. A wrong byte, a missing,
// repeated or unknown batch makes the rank fail and the program exit 1.
//
// With --gpu the staging areas and caches are GPU memory (device
// LOCAL_RANK mod the devices there are): between ranks on one host the
// pages go device to device through CUDA IPC, elsewhere staged through
// host memory over TCP; a prefill rank generates each batch's pages in
// host memory and copies them up, a decode rank copies each page down to
// check it.
//
// It needs the store of slimerun (or torchrun with its agent store): the
// endpoints find each other there. Across hosts, set SLIME_SOCKET_IFNAME
// or let MASTER_ADDR pick the interface, as for the collectives.
package main

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/spf13/pflag"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/bytesize"
	"github.com/slimego/slimego/internal/machine"
	"github.com/slimego/slimego/internal/pattern"
	"github.com/slimego/slimego/p2p"
	"github.com/slimego/slimego/rendezvous"
)

type config struct {
	prefill, decode int // ranks of each role
	pages, pageSize int // a decode rank's cache: pages of pageSize bytes
	batch, inflight int // pages per WriteWithImm, batches in flight per prefill rank
	rounds          int
	tcpOnly         bool
	gpu             bool // staging areas and caches in GPU memory
	timeout         time.Duration
	corrupt         int // a test's: prefill rank 0 flips a byte of this page in round 0 (-1: none)
}

// pairPages is how many pages of one decode rank's cache prefill rank p
// writes (its pages are p, p+P, p+2P, ...).
func (c config) pairPages(p int) int { return (c.pages - p + c.prefill - 1) / c.prefill }

// batches is how many batches prefill rank p sends one decode rank per round.
func (c config) batches(p int) int { return (c.pairPages(p) + c.batch - 1) / c.batch }

// order is the scattered order in which prefill rank p writes its pages of
// decode rank d's cache in round r: page indexes into the cache.
func (c config) order(r, p, d int) []int {
	n := c.pairPages(p)
	rng := rand.New(rand.NewPCG(uint64(r)<<32|uint64(p)<<16|uint64(d), 0x6b76636163686521))
	out := make([]int, n)
	for i, k := range rng.Perm(n) {
		out[i] = p + k*c.prefill
	}
	return out
}

// seed is the data of page slot (a cache page index) written by prefill p
// to decode d in round r.
func seed(r, p, d, slot int) uint64 {
	return pattern.Seed(p, r, uint64(d)<<32|uint64(slot))
}

func main() {
	var c config
	prefill := pflag.Int("prefill", 0, "prefill ranks: the first ones (default half of the world)")
	pflag.IntVar(&c.pages, "pages", 2048, "pages in each decode rank's KV cache")
	pageSize := pflag.String("page-size", "16K", "bytes per page (one layer's K and V of a block of tokens)")
	pflag.IntVar(&c.batch, "batch", 64, "pages per batched write (one immediate each)")
	pflag.IntVar(&c.inflight, "inflight", 4, "batches a prefill rank has in flight")
	pflag.IntVar(&c.rounds, "rounds", 3, "rounds: each rewrites every cache with new data")
	pflag.BoolVar(&c.tcpOnly, "tcp-only", false, "carry the pages over TCP even between ranks on one host")
	pflag.BoolVar(&c.gpu, "gpu", false, "keep the staging areas and caches in GPU memory (CUDA IPC between ranks on one host)")
	pflag.DurationVar(&c.timeout, "timeout", time.Minute, "bound on every wait")
	pflag.IntVar(&c.corrupt, "corrupt-page", -1, "prefill rank 0 sends this page with one byte wrong in round 0 (to see the check fail)")
	pflag.Parse()
	ps, err := bytesize.Parse(*pageSize)
	if err != nil || ps < 1 || ps > 1<<30 {
		fail("--page-size %q: want 1 byte to 1G", *pageSize)
	}
	c.pageSize = int(ps)
	if c.batch < 1 || c.batch > p2p.MaxBatch {
		fail("--batch %d: want 1 to %d pages", c.batch, p2p.MaxBatch)
	}
	for _, f := range []struct {
		name string
		n    int
	}{{"inflight", c.inflight}, {"rounds", c.rounds}, {"pages", c.pages}} {
		if f.n < 1 {
			fail("--%s %d: want a positive count", f.name, f.n)
		}
	}
	if c.timeout <= 0 {
		fail("--timeout %v: want a positive duration", c.timeout)
	}
	o, err := collective.LoadEnv(os.Getenv)
	if err != nil {
		fail("%v", err)
	}
	c.prefill = *prefill
	if c.prefill == 0 {
		c.prefill = o.WorldSize / 2
	}
	c.decode = o.WorldSize - c.prefill
	if c.prefill < 1 || c.decode < 1 {
		fail("world of %d with %d prefill ranks: want at least one of each role (run it under slimerun --nproc-per-node 2 or more)", o.WorldSize, c.prefill)
	}
	if c.pages < c.prefill {
		fail("--pages %d: fewer than the %d prefill ranks", c.pages, c.prefill)
	}
	if c.corrupt != -1 && (c.corrupt < 0 || c.corrupt >= c.pages || c.corrupt%c.prefill != 0) {
		fail("--corrupt-page %d: not a page of prefill rank 0 (0, %d, %d, … below --pages %d)", c.corrupt, c.prefill, 2*c.prefill, c.pages)
	}
	// What a rank allocates (host memory, also with --gpu: staged), in
	// bytes, counted without overflow: a prefill rank's staging area, a
	// decode rank's cache.
	stage := big.NewInt(int64(c.decode))
	for _, f := range []int{c.inflight, c.batch, c.pageSize} {
		stage.Mul(stage, big.NewInt(int64(f)))
	}
	cache := new(big.Int).Mul(big.NewInt(int64(c.pages)), big.NewInt(int64(c.pageSize)))
	limit, what := machine.Share(1)
	for _, m := range []struct {
		what string
		n    *big.Int
	}{{"a prefill rank's staging area (decode ranks × --inflight × --batch × --page-size)", stage}, {"a decode rank's cache (--pages × --page-size)", cache}} {
		if m.n.Cmp(big.NewInt(limit)) > 0 {
			fail("%s is %s bytes, more than the %d bytes of %s", m.what, m.n, limit, what)
		}
	}
	if err := run(o, c); err != nil {
		if _, ok := errors.AsType[reported](err); !ok {
			fmt.Fprintf(os.Stderr, "kvcache: rank %d: %v\n", o.Rank, err)
		}
		os.Exit(1)
	}
}

// reported is an error that run has printed already.
type reported struct{ error }

func (r reported) Unwrap() error { return r.error }

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "kvcache: "+format+"\n", args...)
	os.Exit(2)
}

// errWrong marks a check that failed on a decode rank.
var errWrong = errors.New("kvcache: wrong data")

func name(rank int) string { return "rank" + strconv.Itoa(rank) }

func run(o collective.Options, c config) error {
	// No deadline for the run: every wait is bounded by --timeout on its
	// own (the store's and the endpoint's Timeout), so that a run of many
	// rounds does not wait rounds times as long for a lost peer.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	auth := rendezvous.Auth{Secret: o.JobSecret, Job: o.JobID}
	dctx, dcancel := context.WithTimeout(ctx, c.timeout)
	st, err := rendezvous.Dial(dctx, net.JoinHostPort(o.MasterAddr, strconv.Itoa(o.MasterPort)), auth)
	dcancel()
	if err != nil {
		return fmt.Errorf("the store (run it under slimerun): %w", err)
	}
	defer st.Close()
	st.Timeout = c.timeout
	e, err := p2p.New(ctx, p2p.Options{Name: name(o.Rank), Store: st, Prefix: o.StoreKey("kvcache"), Auth: auth,
		IfName: o.SocketIfName, MasterAddr: o.MasterAddr, TCPOnly: c.tcpOnly, Timeout: c.timeout})
	if err != nil {
		return err
	}
	defer e.Close()
	if o.Rank < c.prefill {
		err = prefillRank(ctx, st, e, o, c)
	} else {
		err = decodeRank(ctx, st, e, o, c)
	}
	if err != nil {
		// Say why now, before the endpoint's Close: for a peer that is
		// alive but silent (stopped, say) it waits up to heartbeats for
		// the leases of this rank's memory to be given back.
		fmt.Fprintf(os.Stderr, "kvcache: rank %d: %v\n", o.Rank, err)
		return reported{err}
	}
	return nil
}

// gpuMem is n bytes of GPU memory on device LOCAL_RANK mod the devices.
func gpuMem(o collective.Options, n int) (*device.CUDABuffer, error) {
	g, err := device.OpenLocalGPU(o.LocalRank)
	if err != nil {
		return nil, fmt.Errorf("--gpu: %w", err)
	}
	return g.Alloc(n)
}

// register registers host as name, or with --gpu GPU memory of its size
// instead (returned, to be filled or read through host).
func register(e *p2p.Endpoint, o collective.Options, c config, name string, host []byte) (*p2p.Region, *device.CUDABuffer, error) {
	if !c.gpu {
		r, err := e.Register(name, host)
		return r, nil, err
	}
	d, err := gpuMem(o, len(host))
	if err != nil {
		return nil, nil, err
	}
	r, err := e.Register(name, d)
	if err != nil {
		d.Free()
		return nil, nil, err
	}
	return r, d, nil
}

// freeRegistered frees GPU memory registered as reg once Deregister has
// returned (no transfer touches it then, and no peer holds it open); if
// Deregister fails, it is left to the process's exit.
func freeRegistered(ctx context.Context, e *p2p.Endpoint, reg *p2p.Region, d *device.CUDABuffer) {
	if err := e.Deregister(ctx, reg); err == nil {
		d.Free()
	}
}

// barrier waits, in the store, for every rank to reach round r's end.
func barrier(ctx context.Context, st *rendezvous.Client, o collective.Options, what string) error {
	if err := st.Barrier(ctx, o.StoreKey("kvcache/"+what), o.Rank, o.WorldSize); err != nil {
		return fmt.Errorf("barrier %s: %w", what, err)
	}
	return nil
}

func prefillRank(ctx context.Context, st *rendezvous.Client, e *p2p.Endpoint, o collective.Options, c config) error {
	p := o.Rank
	// The staging area: inflight batches of pages, per decode rank.
	stage := make([]byte, c.decode*c.inflight*c.batch*c.pageSize)
	reg, dstage, err := register(e, o, c, "stage", stage) // with --gpu dstage is filled from stage
	if err != nil {
		return err
	}
	if dstage != nil {
		defer freeRegistered(ctx, e, reg, dstage)
	}
	if err := e.Publish(ctx); err != nil {
		return err
	}
	peers := make([]*p2p.Peer, c.decode)
	caches := make([]p2p.RemoteRegion, c.decode)
	for d := range peers {
		if peers[d], err = e.Connect(ctx, name(c.prefill+d)); err != nil {
			return err
		}
		var ok bool
		if caches[d], ok = peers[d].Remote("kv"); !ok {
			return fmt.Errorf("decode rank %d published no \"kv\" region", c.prefill+d)
		}
	}
	if err := barrier(ctx, st, o, "connected"); err != nil {
		return err
	}
	transports := map[string]bool{}
	var moved int64
	var busy time.Duration
	for r := range c.rounds {
		t0 := time.Now()
		// Each decode rank gets its batches in turn, inflight of them
		// outstanding per decode rank: a slot of the staging area is
		// refilled only once its previous write is done.
		futs := make([][]*p2p.Future, c.decode)
		for d := range futs {
			futs[d] = make([]*p2p.Future, c.inflight)
		}
		orders := make([][]int, c.decode)
		for d := range orders {
			orders[d] = c.order(r, p, d)
		}
		for v := range c.batches(p) {
			for d := range c.decode {
				w := v % c.inflight
				if f := futs[d][w]; f != nil {
					if err := f.Wait(ctx); err != nil {
						return fmt.Errorf("round %d, batch to rank %d: %w", r, c.prefill+d, err)
					}
					transports[f.Transport()] = true
				}
				pages := orders[d][v*c.batch : min((v+1)*c.batch, len(orders[d]))]
				ops := make([]p2p.Op, len(pages))
				for j, slot := range pages {
					off := ((d*c.inflight+w)*c.batch + j) * c.pageSize
					pattern.Fill(stage[off:off+c.pageSize], seed(r, p, d, slot))
					if r == 0 && p == 0 && slot == c.corrupt {
						stage[off+c.pageSize/2] ^= 0x5a
					}
					ops[j] = p2p.Op{Local: reg, LocalOff: off, Remote: caches[d], RemoteOff: slot * c.pageSize, Len: c.pageSize}
					moved += int64(c.pageSize)
				}
				if dstage != nil { // the batch's pages up to the GPU
					lo := (d*c.inflight + w) * c.batch * c.pageSize
					n := len(pages) * c.pageSize
					v, err := dstage.Slice(lo, n)
					if err == nil {
						err = v.CopyFromHost(stage[lo : lo+n])
					}
					if err != nil {
						return fmt.Errorf("round %d: staging a batch in GPU memory: %w", r, err)
					}
				}
				futs[d][w] = peers[d].WriteWithImm(ops, uint32(v))
			}
		}
		for d := range futs {
			for _, f := range futs[d] {
				if f == nil {
					continue
				}
				if err := f.Wait(ctx); err != nil {
					return fmt.Errorf("round %d, a batch to rank %d: %w", r, c.prefill+d, err)
				}
				transports[f.Transport()] = true
			}
		}
		busy += time.Since(t0)
		if err := barrier(ctx, st, o, "round"+strconv.Itoa(r)); err != nil {
			return err
		}
	}
	var ts []string
	for t := range transports {
		ts = append(ts, t)
	}
	slices.Sort(ts)
	fmt.Printf("PASS rank %d (prefill): %d rounds, %d pages of %s to %d decode ranks in batches of %d, %.3f GB/s (page data generated in the loop), over %v\n",
		p, c.rounds, moved/int64(c.pageSize), bytesize.Format(int64(c.pageSize)), c.decode, c.batch, float64(moved)/busy.Seconds()/1e9, ts)
	return nil
}

func decodeRank(ctx context.Context, st *rendezvous.Client, e *p2p.Endpoint, o collective.Options, c config) error {
	d := o.Rank - c.prefill
	cache := make([]byte, c.pages*c.pageSize)
	reg, dcache, err := register(e, o, c, "kv", cache) // with --gpu dcache is copied down page by page to check
	if err != nil {
		return err
	}
	if dcache != nil {
		defer freeRegistered(ctx, e, reg, dcache)
	}
	if err := e.Publish(ctx); err != nil {
		return err
	}
	if err := barrier(ctx, st, o, "connected"); err != nil {
		return err
	}
	// Each prefill rank's immediates are taken from its link (Peer.Imm),
	// which fails at once when the rank is lost.
	peers := make([]*p2p.Peer, c.prefill)
	for p := range peers {
		if peers[p], err = e.Connect(ctx, name(p)); err != nil {
			return err
		}
	}
	var checked, wrong int64
	want := make([]byte, c.pageSize)
	for r := range c.rounds {
		// Which batches of which prefill rank arrived this round.
		seen := make([][]bool, c.prefill)
		orders := make([][]int, c.prefill)
		expect := 0
		for p := range seen {
			seen[p] = make([]bool, c.batches(p))
			orders[p] = c.order(r, p, d)
			expect += c.batches(p)
		}
		// check checks the pages of batch im of prefill rank p.
		check := func(p int, im p2p.Imm) error {
			v := int(im.Value)
			if v >= len(seen[p]) || seen[p][v] {
				return fmt.Errorf("%w: round %d: an unknown or repeated immediate %d from %q", errWrong, r, im.Value, im.Peer)
			}
			seen[p][v] = true
			for _, slot := range orders[p][v*c.batch : min((v+1)*c.batch, len(orders[p]))] {
				page := cache[slot*c.pageSize : (slot+1)*c.pageSize]
				if dcache != nil {
					v, err := dcache.Slice(slot*c.pageSize, c.pageSize)
					if err == nil {
						err = v.CopyToHost(page)
					}
					if err != nil {
						return fmt.Errorf("round %d: reading a page of the GPU cache: %w", r, err)
					}
				}
				s := seed(r, p, d, slot)
				if pattern.Check(page, s) >= 0 {
					pattern.Fill(want, s)
					for i := range page {
						if page[i] != want[i] {
							wrong++
						}
					}
				}
				checked++
			}
			return nil
		}
		// One taker per prefill rank, of its round's batches: the batches
		// are checked in the order they arrive, whichever rank's, so that
		// no rank's immediates pile up unread while another's are awaited
		// (the endpoint bounds how many wait), and a lost rank fails its
		// taker at once.
		rctx, stop := context.WithCancel(ctx)
		arrived := make(chan taken, expect)
		var takers sync.WaitGroup
		for p := range c.prefill {
			takers.Go(func() {
				for range c.batches(p) {
					im, err := peers[p].Imm(rctx)
					arrived <- taken{p, im, err}
					if err != nil {
						return
					}
				}
			})
		}
		err := func() error {
			for range expect {
				a := <-arrived
				p, im := a.p, a.im
				if a.err != nil {
					return fmt.Errorf("round %d, waiting for a batch of rank %d (%d pages checked): %w", r, p, checked, a.err)
				}
				if err := check(p, im); err != nil {
					return err
				}
			}
			return nil
		}()
		stop()
		takers.Wait()
		if err != nil {
			return err
		}
		if wrong != 0 {
			return fmt.Errorf("%w: round %d: %d wrong bytes in %d pages", errWrong, r, wrong, checked)
		}
		if err := barrier(ctx, st, o, "round"+strconv.Itoa(r)); err != nil {
			return err
		}
	}
	fmt.Printf("PASS rank %d (decode): %d rounds, %d pages of %s from %d prefill ranks checked byte for byte, 0 wrong\n",
		o.Rank, c.rounds, checked, bytesize.Format(int64(c.pageSize)), c.prefill)
	return nil
}

// taken is an immediate a decode rank's taker took from prefill rank p,
// or why it could not.
type taken struct {
	p   int
	im  p2p.Imm
	err error
}
