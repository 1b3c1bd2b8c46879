package inter

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/fault"
)

func TestDecodeGone(t *testing.T) {
	long := strings.Repeat("x", maxGoneReason+1)
	for _, tc := range []struct {
		in   string
		want goneRecord
		ok   bool
	}{
		{"2 3 lost\npeer lost: connection to rank 2 closed while sending", goneRecord{2, 3, "peer lost: connection to rank 2 closed while sending", false}, true},
		{"2 3 waited\ntimeout: receiving a header, peer rank 2", goneRecord{2, 3, "timeout: receiving a header, peer rank 2", true}, true},
		{"0 0 lost\n", goneRecord{0, 0, "", false}, true},
		{"2 3\nx", goneRecord{}, false},       // no how
		{"2 3 slow\nx", goneRecord{}, false},  // an unknown how
		{"7 1 lost\nx", goneRecord{}, false},  // rank 7 of 4
		{"-1 1 lost\nx", goneRecord{}, false}, // negative
		{"02 1 lost\nx", goneRecord{}, false}, // not canonical
		{"+2 1 lost\nx", goneRecord{}, false},
		{"2  1 lost\nx", goneRecord{}, false},
		{"2 1 lost", goneRecord{}, false},             // no reason line
		{"2 1 lost\nbell\a", goneRecord{}, false},     // a control character
		{"2 1 lost\nnext\nline", goneRecord{}, false}, // a second line
		{"2 1 lost\n\xff", goneRecord{}, false},       // not UTF-8
		{"2 1 lost\n" + long, goneRecord{}, false},
	} {
		got, err := decodeGone([]byte(tc.in), 4)
		if tc.ok != (err == nil) || tc.ok && got != tc.want {
			t.Errorf("decodeGone(%q) = %+v, %v; want %+v, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrGoneRecord) {
			t.Errorf("decodeGone(%q): %v is not ErrGoneRecord", tc.in, err)
		}
	}
}

// TestGoneRecordRoundTrip: what Record writes decodes to itself, whatever
// the reason holds (cut and made printable).
func TestGoneRecordRoundTrip(t *testing.T) {
	for _, reason := range []string{"", "timeout: receiving a header, peer rank 2", "a\nb\tc\x00", strings.Repeat("é", maxGoneReason)} {
		r := goneRecord{culprit: 3, witness: 1, reason: reason, waited: len(reason)%2 == 0}
		got, err := decodeGone(r.encode(), 4)
		if err != nil || got.culprit != 3 || got.witness != 1 || got.waited != r.waited || got.reason != clean(reason) || len(got.reason) > maxGoneReason {
			t.Errorf("%q: got %+v, %v", reason, got, err)
		}
	}
}

func FuzzDecodeGone(f *testing.F) {
	f.Add([]byte("2 3 lost\npeer lost: connection to rank 2 closed while sending"), 4)
	f.Add([]byte("0 0 waited\n"), 0)
	f.Add([]byte("99999999999999999999 1 lost\nx"), 0)
	f.Fuzz(func(t *testing.T, b []byte, world int) {
		r, err := decodeGone(b, world)
		if err != nil {
			return
		}
		if r.culprit < 0 || r.witness < 0 || world > 0 && (r.culprit >= world || r.witness >= world) {
			t.Fatalf("accepted ranks %d, %d of %d", r.culprit, r.witness, world)
		}
		if clean(r.reason) != r.reason || string(r.encode()) != string(b) {
			t.Fatalf("accepted %q, which encodes as %q", b, r.encode())
		}
	})
}

// TestExplain: a rank whose peer gave up names the rank the peer's record
// holds responsible, with the witness's account; a peer without a record,
// or with one that is not one (written by whoever reached the store), is
// named itself.
func TestExplain(t *testing.T) {
	cs := testStore(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tr := func(c int, rank int) *Transport {
		return &Transport{cfg: Config{Store: cs[c], Key: "job", Rank: rank, World: 5}}
	}
	closed := fmt.Errorf("%w: connection to rank 3 closed while receiving a header", fault.ErrPeerLost)
	// Rank 3 saw rank 2 die and gave up.
	r3 := tr(0, 3)
	r3.Record(2, fmt.Errorf("%w: connection to rank 2 closed while sending", fault.ErrPeerLost))
	r3.Record(1, errors.New("a second account is not written"))
	r4 := tr(1, 4)
	who, err := r4.Explain(3, closed)
	want := "slimego: peer lost: rank 2, as rank 3 saw it (peer lost: connection to rank 2 closed while sending); rank 3 then gave up (here: connection to rank 3 closed while receiving a header)"
	if who != 2 || !errors.Is(err, fault.ErrPeerLost) || err.Error() != want {
		t.Fatalf("Explain = %d, %v\nwant 2, %s", who, err, want)
	}
	// Rank 4 passes rank 3's account on unchanged.
	r4.Record(who, err)
	if v, gerr := cs[0].Get(ctx, "job/gone/4"); gerr != nil || string(v) != "2 3 lost\npeer lost: connection to rank 2 closed while sending" {
		t.Fatalf("rank 4's record %q, %v", v, gerr)
	}
	// A peer without a record is named itself.
	if who, err := r4.Explain(0, closed); who != 0 || err != closed {
		t.Errorf("no record: %d, %v", who, err)
	}
	// A record that names a rank outside the job is not believed.
	for _, bad := range []string{"9 1 lost\nx", "1 1 lost\n\x1b[2J", "garbage"} {
		if err := cs[0].Set(ctx, "job/gone/1", []byte(bad)); err != nil {
			t.Fatal(err)
		}
		who, err := r4.Explain(1, closed)
		if who != 1 || !errors.Is(err, fault.ErrPeerLost) || !strings.Contains(err.Error(), "malformed failure record") {
			t.Errorf("record %q: %d, %v", bad, who, err)
		}
	}
	// The rank a record holds responsible may be this one.
	r0 := tr(0, 0)
	r0.Record(4, fmt.Errorf("%w: receiving a header, peer rank 4", fault.ErrTimeout))
	if who, err := r4.Explain(0, closed); who != 0 || !strings.Contains(err.Error(), "peer lost: this rank, as rank 0 saw it (timeout: receiving a header, peer rank 4)") {
		t.Errorf("this rank held responsible: %d, %v", who, err)
	}
}

// TestExplainBounded: a store that does not answer costs a failing rank
// at most GoneTimeout for its look-up and as much for its record.
func TestExplainBounded(t *testing.T) {
	cs := testStore(t, 1)
	r := &Transport{cfg: Config{Store: cs[0], Key: "job", Rank: 1, World: 2}}
	// Hold the client's one call slot with a Get of a key that never
	// comes, for longer than the bound.
	hold, release := context.WithTimeout(context.Background(), 2*time.Second)
	defer release()
	go cs[0].Get(hold, "never")
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	closed := fmt.Errorf("%w: connection to rank 0 closed while sending", fault.ErrPeerLost)
	if who, err := r.Explain(0, closed); who != 0 || err != closed {
		t.Errorf("Explain = %d, %v", who, err)
	}
	r.Record(0, closed)
	if d := time.Since(start); d > 2*GoneTimeout+200*time.Millisecond { // each within GoneTimeout
		t.Errorf("Explain and Record took %v (bound %v)", d, GoneTimeout)
	}
}

// TestExplainFollowsWaits: ranks whose waits timed out at about the same
// moment, each waiting for the next, name the rank at the end of the
// chain, the one that recorded nothing (the late one), whichever of them
// recorded first; a lost peer's record that names a rank which waited in
// vain is followed to the rank that one waited for.
func TestExplainFollowsWaits(t *testing.T) {
	cs := testStore(t, 5)
	tr := func(rank int) *Transport {
		return &Transport{cfg: Config{Store: cs[rank], Key: "job", Rank: rank, World: 5}}
	}
	waited := func(p int) error { return fmt.Errorf("%w: receiving a header, peer rank %d", fault.ErrTimeout, p) }
	// A ring 0 <- 4 <- 3 <- 2 (late): rank 0 explains its timeout first,
	// rank 4 and rank 3 record theirs a little later.
	r0 := tr(0)
	r0.Record(4, waited(4))
	done := make(chan struct{})
	var who int
	var err error
	go func() {
		defer close(done)
		who, err = r0.Explain(4, waited(4))
	}()
	time.Sleep(30 * time.Millisecond)
	tr(4).Record(3, waited(3))
	time.Sleep(30 * time.Millisecond)
	tr(3).Record(2, waited(2))
	<-done
	want := "slimego: timeout: rank 2, as rank 3 saw it (timeout: receiving a header, peer rank 2), held up this rank's wait for rank 4 (here: receiving a header, peer rank 4)"
	if who != 2 || !errors.Is(err, fault.ErrTimeout) || err.Error() != want {
		t.Fatalf("Explain = %d, %v\nwant 2, %s", who, err, want)
	}
	// Rank 1 sees rank 0's connection close: rank 0 recorded that it
	// waited for rank 4, and rank 4 that it waited for rank 3, ...
	closed := fmt.Errorf("%w: connection to rank 0 closed while receiving a header", fault.ErrPeerLost)
	who, err = tr(1).Explain(0, closed)
	if who != 2 || !errors.Is(err, fault.ErrPeerLost) || !strings.Contains(err.Error(), "peer lost: rank 2, as rank 3 saw it") {
		t.Fatalf("Explain of a lost peer = %d, %v", who, err)
	}
}

func TestGoneWait(t *testing.T) {
	for _, tc := range []struct{ timeout, want time.Duration }{
		{0, GoneTimeout},
		{time.Second, GoneTimeout},
		{3 * time.Second, 750 * time.Millisecond},
		{5 * time.Minute, MaxGoneWait},
	} {
		if got := goneWait(tc.timeout); got != tc.want {
			t.Errorf("goneWait(%v) = %v, want %v", tc.timeout, got, tc.want)
		}
	}
}

// TestRecordBeforeInterrupt: a caller whose Record returns goes on to
// interrupt the link (ring.go), closing the connections the peers then
// see close: this rank's record must be in the store by then, also where
// a connection goroutine's loss (lose) wrote it, at the same time.
func TestRecordBeforeInterrupt(t *testing.T) {
	cs := testStore(t, 2)
	missing := 0
	const runs = 200
	for i := range runs {
		tr := &Transport{cfg: Config{Store: cs[0], Key: fmt.Sprintf("job%d", i), Rank: 3, World: 5}, explained: make(chan struct{})}
		p := &peer{t: tr, rank: 4}
		done := make(chan struct{})
		go func() {
			defer close(done)
			p.lose(fmt.Errorf("%w: connection to rank 4 closed while sending", fault.ErrPeerLost))
		}()
		for !tr.losing.Load() {
		}
		// The caller's own receive from rank 2 failed too.
		err, peer := blame(tcpLink{tr}, fmt.Errorf("%w: connection to rank 2 closed", fault.ErrPeerLost), 2)
		tr.Record(peer, err)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		ok, cerr := cs[1].Check(ctx, tr.goneKey(3))
		cancel()
		if cerr != nil {
			t.Fatal(cerr)
		}
		if !ok {
			missing++
		}
		<-done
	}
	if missing > 0 {
		t.Errorf("%d of %d runs: Record returned before this rank's record was in the store", missing, runs)
	}
}
