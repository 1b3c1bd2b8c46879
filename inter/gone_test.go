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
		{"2 3\npeer lost: connection to rank 2 closed while sending", goneRecord{2, 3, "peer lost: connection to rank 2 closed while sending"}, true},
		{"0 0\n", goneRecord{0, 0, ""}, true},
		{"7 1\nx", goneRecord{}, false},  // rank 7 of 4
		{"-1 1\nx", goneRecord{}, false}, // negative
		{"02 1\nx", goneRecord{}, false}, // not canonical
		{"+2 1\nx", goneRecord{}, false},
		{"2  1\nx", goneRecord{}, false},
		{"2 1", goneRecord{}, false},             // no reason line
		{"2\nx", goneRecord{}, false},            // no witness
		{"2 1\nbell\a", goneRecord{}, false},     // a control character
		{"2 1\nnext\nline", goneRecord{}, false}, // a second line
		{"2 1\n\xff", goneRecord{}, false},       // not UTF-8
		{"2 1\n" + long, goneRecord{}, false},
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
		r := goneRecord{culprit: 3, witness: 1, reason: reason}
		got, err := decodeGone(r.encode(), 4)
		if err != nil || got.culprit != 3 || got.witness != 1 || got.reason != clean(reason) || len(got.reason) > maxGoneReason {
			t.Errorf("%q: got %+v, %v", reason, got, err)
		}
	}
}

func FuzzDecodeGone(f *testing.F) {
	f.Add([]byte("2 3\npeer lost: connection to rank 2 closed while sending"), 4)
	f.Add([]byte("0 0\n"), 0)
	f.Add([]byte("99999999999999999999 1\nx"), 0)
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
	if v, gerr := cs[0].Get(ctx, "job/gone/4"); gerr != nil || string(v) != "2 3\npeer lost: connection to rank 2 closed while sending" {
		t.Fatalf("rank 4's record %q, %v", v, gerr)
	}
	// A wait that timed out, or whose peer has no record, is left as it is.
	timeout := fmt.Errorf("%w: receiving a header, peer rank 1", fault.ErrTimeout)
	if who, err := r4.Explain(3, timeout); who != 3 || err != timeout {
		t.Errorf("a timeout: %d, %v", who, err)
	}
	if who, err := r4.Explain(0, closed); who != 0 || err != closed {
		t.Errorf("no record: %d, %v", who, err)
	}
	// A record that names a rank outside the job is not believed.
	for _, bad := range []string{"9 1\nx", "1 1\n\x1b[2J", "garbage"} {
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
// at most GoneTimeout for its look-up and its record together.
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
	if d := time.Since(start); d > GoneTimeout+200*time.Millisecond {
		t.Errorf("Explain and Record took %v (bound %v)", d, GoneTimeout)
	}
}
