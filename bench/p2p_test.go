package bench

import (
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/machine"
	"github.com/slimego/slimego/internal/testranks"
)

// TestP2PSweep runs a tiny slimebench p2p sweep between two in-process
// ranks (each its own endpoint, linked through the job's store), over the
// same-host transport (plain memory, in 4 KiB or huge pages, Shared and
// symmetric memory) and over TCP,
// and checks the CSV: its exact header,
// a row for every combination with the transport the transfers reported,
// the raw TCP, memcpy and registration rows beside them, and no wrong
// byte. With GPU memory (the emulated CUDA library; between ranks of one
// process, which cannot open each other's IPC handles, it goes over TCP)
// the data goes up and comes back for checking, and the paired rows are
// left out.
func TestP2PSweep(t *testing.T) {
	for _, want := range []string{"cma", "tcp", "shm", "symmetric", "huge", "gpu"} {
		tcpOnly := want == "tcp"
		gpu := want == "gpu"
		symmetric := want == "symmetric"
		huge := want == "huge"
		t.Run(want, func(t *testing.T) {
			if symmetric {
				want = "shm"
			}
			if huge {
				want = "cma"
			}
			if gpu {
				if _, err := device.CUDADeviceCount(); err != nil {
					t.Skip("no CUDA backend:", err)
				}
				want = "tcp"
			}
			cfg := P2PConfig{Sizes: []int64{2 << 10, 64 << 10}, Batches: []int{1, 4}, Concurrency: []int{1, 3},
				TCPOnly: tcpOnly, Shared: want == "shm" && !symmetric, Symmetric: symmetric, Huge: huge, GPU: gpu, MinTime: time.Millisecond, MaxRounds: 6, Baselines: true, RegisterBytes: 4 << 20}
			rows := p2pRanks(t, cfg)
			if t.Failed() {
				return
			}
			var tbl strings.Builder
			WriteP2PTable(&tbl, rows[0], "TestP2PSweep")
			t.Log("\n" + tbl.String())
			if !gpu && !regexp.MustCompile(`(?m)^ tcp +tcp-\d+ +oneway +\S+ +1 +1 +\S+ +- +\S+ +- +-$`).MatchString(tbl.String()) {
				t.Errorf("the table's tcp oneway rows show a p99, CPU or wrong count they do not measure")
			}
			recs := p2pCSV(t, rows[0])
			if got := strings.Join(recs[0], ","); got != "impl,transport,op,S,batch,concurrency,p50_us,p99_us,GBps,cpu_s_per_GB,wrong" {
				t.Fatalf("header %s", got)
			}
			count := map[string]int{}
			for _, r := range recs[1:] {
				if len(r) != 11 {
					t.Fatalf("row %v has %d columns", r, len(r))
				}
				if unchecked := r[0] != "p2p" || r[2] == "register"; unchecked && r[10] != "" || !unchecked && r[10] != "0" {
					t.Errorf("row %v: wrong bytes, or a wrong count where nothing is checked", r)
				}
				count[r[0]+" "+r[2]]++
				// A baseline measures no CPU, nor a p99 unless paired:
				// left empty, not 0.
				paired := strings.HasSuffix(r[2], "-paired")
				if strings.HasPrefix(r[2], "pingpong") && r[8] != "" {
					t.Errorf("row %v: a ping-pong's GB/s is not a measurement, want it empty", r)
				}
				if (r[0] == "tcp" || r[0] == "memcpy") && (r[7] != "" && !paired || r[9] != "") || r[0] == "p2p" && !paired && (r[7] == "" || r[9] == "") {
					t.Errorf("row %v: a figure the row does not measure is not empty, or one it does is", r)
				}
				// On one host every batch, small ones too, is copied
				// through the region's lease, which the warm-up took.
				if r[0] == "p2p" && (r[2] == "read" || r[2] == "write" || r[2] == "read-paired") && r[1] != want {
					t.Errorf("row %v: transport %q, want %q", r, r[1], want)
				}
			}
			// 2 sizes × 2 batches × 2 concurrencies per op, and the 8-byte read.
			// The paired rows: the 8-byte read with the ping-pong, 64 × 64 KiB
			// with the link and memcpy at 4 MiB.
			paired := 1
			if gpu {
				paired = 0
			}
			if count["p2p read"] != 9 || count["p2p write"] != 8 || count["p2p register"] != 2 ||
				count["tcp pingpong"] != 1 || count["tcp oneway"] == 0 || count["memcpy copy"] != count["tcp oneway"] ||
				count["p2p read-paired"] != 2*paired || count["tcp pingpong-paired"] != paired || count["tcp oneway-paired"] != paired || count["memcpy copy-paired"] != paired {
				t.Errorf("rows per kind %v\n%s", count, recs)
			}
			for _, r := range rows[0] {
				if r.Op != "register" && r.Op != "pingpong" && r.Op != "pingpong-paired" && (r.GBps <= 0 || r.P50 <= 0) ||
					r.Impl == "p2p" && r.P99 < r.P50 {
					t.Errorf("row %+v: figures missing", r)
				}
			}
			if n := len(P2PTargets(rows[0])); !gpu && (tcpOnly && n != 2 || !tcpOnly && n != 1) {
				t.Errorf("no target line from\n%s", recs)
			}
		})
	}
}

// TestPairedStalledPeer: slimebench p2p's paired raw transfer with a peer
// that opened the plain connections and then sends nothing ends at the
// communicator's timeout with an error naming the ranks, not a hang (an
// inter.Reader's first read would otherwise clear the socket's deadline).
func TestPairedStalledPeer(t *testing.T) {
	const timeout = 2 * time.Second
	done := make(chan struct{})
	testranks.Run(t, 2, 1, func(o *collective.Options) { o.Timeout = timeout }, func(c *collective.Communicator) error {
		l, err := openLink(context.Background(), c, "127.0.0.1", 2, 4<<20)
		if err != nil {
			return err
		}
		defer l.close()
		if c.Rank() == 1 {
			<-done
			return nil
		}
		defer close(done)
		res := make(chan error, 1)
		go func() {
			l.arm()
			res <- l.oneway(make([]byte, 1<<20), false)
		}()
		select {
		case err = <-res:
		case <-time.After(3 * timeout):
			l.close()
			return fmt.Errorf("a paired receive from a stalled peer still waiting after %v", 3*timeout)
		}
		if err == nil || !strings.Contains(err.Error(), "rank 0 with rank 1") {
			return fmt.Errorf("a paired receive from a stalled peer: %v, want a deadline error naming ranks 0 and 1", err)
		}
		return nil
	})
}

// TestP2PWriteImm: slimebench p2p's writeimm rows (WriteWithImm, rank 0
// taking each batch's immediate in and checking it) over TCP, where a
// batch of one stripe carries its immediate in the write's request, and
// on one host: every combination has its row, with no wrong byte or
// immediate.
func TestP2PWriteImm(t *testing.T) {
	for _, tcpOnly := range []bool{true, false} {
		t.Run(map[bool]string{true: "tcp", false: "same-host"}[tcpOnly], func(t *testing.T) {
			cfg := P2PConfig{Sizes: []int64{8, 256 << 10}, Batches: []int{1, 4}, Concurrency: []int{1, 3}, Ops: []string{"writeimm"},
				TCPOnly: tcpOnly, MinTime: time.Millisecond, MaxRounds: 6}
			rows := p2pRanks(t, cfg)
			if t.Failed() {
				return
			}
			n := 0
			for _, r := range rows[0] {
				if r.Op != "writeimm" {
					continue
				}
				n++
				if r.Wrong != 0 || r.GBps <= 0 || r.P50 <= 0 {
					t.Errorf("row %+v", r)
				}
			}
			if n != 8 {
				t.Errorf("%d writeimm rows, want 8:\n%+v", n, rows[0])
			}
		})
	}
}

// p2pRanks runs P2P with cfg on two in-process ranks and returns each
// rank's rows.
func p2pRanks(t *testing.T, cfg P2PConfig) [][]P2PResult {
	t.Helper()
	rows := make([][]P2PResult, 2)
	testranks.Run(t, 2, 1, nil, func(c *collective.Communicator) error {
		rs, err := P2P(context.Background(), c, cfg)
		rows[c.Rank()] = rs
		return err
	})
	return rows
}

// TestP2PTargetsVerdict: a ratio just past a target reads as past it (it
// was printed to two places, "1.20 (<= 1.2: NOT met)").
func TestP2PTargetsVerdict(t *testing.T) {
	for _, tc := range []struct {
		read, pingpong float64
		want           string
	}{
		{47.86, 39.76, "= 1.204 (<= 1.2: NOT met; tcp)"},
		{47.70, 39.76, "= 1.200 (<= 1.2: met; tcp)"},
		{44.81, 39.58, "= 1.132 (<= 1.2: met; tcp)"},
	} {
		rs := []P2PResult{
			{Impl: "tcp", Op: "pingpong-paired", S: 8, Batch: 1, P50: tc.pingpong},
			{Impl: "p2p", Op: "read-paired", S: 8, Batch: 1, P50: tc.read, Transport: "tcp"},
		}
		got := P2PTargets(rs)
		if len(got) != 1 || !strings.HasSuffix(got[0], tc.want) {
			t.Errorf("%v / %v: %q, want one line ending %q", tc.read, tc.pingpong, got, tc.want)
		}
	}
}

// TestQuantileNearestRank: p50 and p99 are nearest-rank quantiles, the
// ⌈q·n⌉-th smallest value, so that at least q of the latencies lie at or
// below the figure: of 60 latencies the p99 is the largest (59 of 60 is
// 98.3%), of 1060 the 1050th.
func TestQuantileNearestRank(t *testing.T) {
	seq := func(n int) []float64 {
		xs := make([]float64, n)
		for i := range xs {
			xs[i] = float64(i + 1)
		}
		return xs
	}
	for _, tc := range []struct {
		n    int
		q    float64
		want float64
	}{
		{1, 0.99, 1}, {5, 0.99, 5}, {60, 0.99, 60}, {100, 0.99, 99}, {160, 0.99, 159},
		{1060, 0.99, 1050}, {10, 0.5, 5}, {11, 0.5, 6}, {40, 0.99, 40},
	} {
		if got := quantile(seq(tc.n), tc.q); got != tc.want {
			t.Errorf("quantile of 1…%d at %g = %v, want %v", tc.n, tc.q, got, tc.want)
		}
	}
}

// TestP2PCPUExcludesWarmup: the CPU column counts the timed rounds alone,
// whose bytes it is divided by: CPU spent before them (in the warm-up
// round) is no part of it. Both ranks run in this process, so CPU that
// rank 1 burns after its warm-up round shows in either rank's window
// that covers it.
func TestP2PCPUExcludesWarmup(t *testing.T) {
	const burn = 500 * time.Millisecond
	testHookWarmedUp = func() {
		for t0 := time.Now(); time.Since(t0) < burn; {
		}
	}
	defer func() { testHookWarmedUp = nil }()
	cfg := P2PConfig{Sizes: []int64{4 << 10}, Batches: []int{1}, Concurrency: []int{1}, Ops: []string{"read", "write"},
		MinTime: time.Nanosecond, MaxRounds: 5}
	rows := p2pRanks(t, cfg)
	if t.Failed() {
		return
	}
	for _, r := range rows[0] {
		moved := 5 * float64(r.S*int64(r.Batch*r.Concurrency)) // MaxRounds rounds
		if cpu := r.CPUPerGB * moved / 1e9; r.Impl == "p2p" && cpu >= burn.Seconds()/2 {
			t.Errorf("%s of %d bytes: %.3f CPU seconds over 5 rounds of 4 KiB: the %v burnt before the timed rounds counted", r.Op, r.S, cpu, burn)
		}
	}
}

// TestP2PUncheckedRowsNoWrong: the wrong column is a count of bytes
// checked. The raw TCP, memcpy and registration rows check no byte (the
// raw link sends a buffer nobody compares, a registration moves nothing):
// their wrong column is '-' in the table and empty in the CSV, as the
// other figures they do not measure, not a 0 that reads as "checked, all
// right". The p2p rows, whose every byte is checked, keep their count.
func TestP2PUncheckedRowsNoWrong(t *testing.T) {
	cfg := P2PConfig{Sizes: []int64{64 << 10}, Batches: []int{1}, Concurrency: []int{1}, Ops: []string{"read"},
		MinTime: time.Millisecond, MaxRounds: 5, Baselines: true, RegisterBytes: 8 << 10}
	rows := p2pRanks(t, cfg)
	if t.Failed() {
		return
	}
	checks := func(impl, op string) bool { return impl == "p2p" && op != "register" }
	var tbl strings.Builder
	WriteP2PTable(&tbl, rows[0], "TestP2PUncheckedRowsNoWrong")
	kinds := map[string]bool{}
	for _, l := range strings.Split(tbl.String(), "\n") {
		f := strings.Fields(l)
		if len(f) != 11 || strings.HasPrefix(l, "#") {
			continue
		}
		kinds[f[0]+" "+f[2]] = true
		if want := "-"; !checks(f[0], f[2]) && f[10] != want {
			t.Errorf("table row %q: wrong %q, want %q (nothing checked)", l, f[10], want)
		} else if checks(f[0], f[2]) && f[10] != "0" {
			t.Errorf("table row %q: wrong %q, want 0", l, f[10])
		}
	}
	for _, k := range []string{"tcp pingpong", "tcp oneway", "memcpy copy", "p2p register", "tcp oneway-paired", "memcpy copy-paired", "p2p read", "p2p read-paired"} {
		if !kinds[k] {
			t.Errorf("no %s row in\n%s", k, tbl.String())
		}
	}
	recs := p2pCSV(t, rows[0])
	for _, r := range recs[1:] {
		if want := ""; !checks(r[0], r[2]) && r[10] != want {
			t.Errorf("csv row %v: wrong %q, want %q (nothing checked)", r, r[10], want)
		} else if checks(r[0], r[2]) && r[10] != "0" {
			t.Errorf("csv row %v: wrong %q, want 0", r, r[10])
		}
	}
}

// TestP2PMemoryOfBothRanks: P2P refuses, before it allocates, a grid whose
// buffers do not fit in the memory available, counting what every rank on
// this host holds at once: its region and the expected bytes (the largest
// combination each), the paired baselines' three buffers and the raw TCP
// baseline's two. It counted one rank's region, expected bytes and two
// paired buffers (4 × the largest), so that two ranks of one host could
// allocate several times the memory it let through. Here 20 MiB are
// available and the grid's largest combination is 4 MiB (64 × 64 KiB,
// paired): 16 MiB passed, but the two ranks need 2 × (2 × 4 + 3 × 4 + 2 × 1)
// MiB.
func TestP2PMemoryOfBothRanks(t *testing.T) {
	memory = func() (int64, int64, bool) { return 20 << 20, 64 << 30, true }
	defer func() { memory = machine.Memory }()
	cfg := P2PConfig{Sizes: []int64{1 << 20}, Batches: []int{1}, Concurrency: []int{1}, Ops: []string{"read"},
		MinTime: time.Millisecond, MaxRounds: 5, Baselines: true}
	errs := make([]error, 2)
	testranks.Run(t, 1, 2, nil, func(c *collective.Communicator) error {
		_, errs[c.Rank()] = P2P(context.Background(), c, cfg)
		return nil
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "lower --max-bytes or --max-in-flight") {
			t.Errorf("rank %d: %v, want a refusal: the ranks need 44 MiB of the 20 MiB available", r, err)
		}
	}
}

// p2pCSV is rs as WriteP2PCSV writes them, read back as records.
func p2pCSV(t *testing.T, rs []P2PResult) [][]string {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteP2PCSV(&buf, rs); err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(&buf).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	return recs
}
