package collective

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/slimego/slimego/inter"
	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/internal/verdict"
	"github.com/slimego/slimego/intra"
)

// call is what a rank passed to a collective, as far as the ranks must
// agree on it: the operation and every rank's block size (nil: all 0).
// A Plan keeps its own; the one-shot calls use the communicator's sizes.
type call struct {
	name  string
	sizes []int
	// refused is why this rank refused its call (a bad argument), or "":
	// it took part with a call of nothing (Communicator.refuse).
	refused string
}

// maxReason bounds a refused call's reason as published (and as read
// from the store, which is not trusted).
const maxReason = 256

// explain turns the ErrSizeMismatch of a call whose ranks disagree into
// one that names the rank whose call differs and what differs in it, in
// the same words on every rank. The engines only see that headers or
// frames disagree (a hash of the call), so the ranks, which all return
// the mismatch from the same call (intra.ErrCallsDiffer and
// inter.ErrCallsDiffer say so), publish their calls in the store and read
// each other's. It runs on the error path only; if the exchange fails (a
// rank gone, the deadline), the engine's error stands.
func (c *Communicator) explain(ctx context.Context, err error, cl call) error {
	if err == nil || c.store == nil || cl.name == "" || !(errors.Is(err, intra.ErrCallsDiffer) || errors.Is(err, inter.ErrCallsDiffer)) {
		return err
	}
	o := c.opts
	seq := c.mismatches
	c.mismatches++
	// Within Options.Timeout, or the context's deadline if earlier.
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	if seq > 1 {
		// Every rank has read this rank's call of the mismatch before the
		// last: this rank read every rank's call of the last one, which a
		// rank publishes only once it has read all of the one before. (A
		// rank may still be reading the last one's: across nodes a rank
		// learns of a mismatch from its neighbour alone.) So two
		// mismatches' keys at a time stay in the store.
		c.store.Delete(ctx, c.key("mismatch/"+strconv.Itoa(seq-2)+"/"+strconv.Itoa(o.Rank)))
	}
	prefix := c.key("mismatch/" + strconv.Itoa(seq) + "/")
	if c.store.Set(ctx, prefix+strconv.Itoa(o.Rank), encodeCall(cl, o.WorldSize)) != nil {
		return err
	}
	calls := make([]call, o.WorldSize)
	for r := range calls {
		if r == o.Rank {
			calls[r] = call{name: cl.name, sizes: sizesOf(cl, o.WorldSize), refused: cl.refused}
			continue
		}
		if c.store.Wait(ctx, prefix+strconv.Itoa(r)) != nil {
			return err
		}
		v, gerr := c.store.Get(ctx, prefix+strconv.Itoa(r))
		if gerr != nil {
			return err
		}
		if calls[r], gerr = decodeCall(v, o.WorldSize); gerr != nil {
			return err
		}
	}
	peer, detail := differs(calls, o.Rank)
	if peer < 0 {
		return err // the calls agree after all: the engine's word stands
	}
	var oe *fault.OpError
	op := cl.name
	if errors.As(err, &oe) {
		op = oe.Op
	}
	kind := ErrSizeMismatch
	if slices.ContainsFunc(calls, func(cl call) bool { return cl.refused != "" }) {
		kind = ErrInvalid
	}
	return fault.New(op, o.Rank, peer, kind, "%s; the ranks' calls differ", detail)
}

func sizesOf(cl call, n int) []int {
	if cl.sizes == nil {
		return make([]int, n)
	}
	return cl.sizes
}

// encodeCall is "NAME SIZE…" (one size per rank), or for a refused call
// "!NAME SIZE… REASON", the reason query-escaped (no spaces).
func encodeCall(cl call, n int) []byte {
	var b []byte
	if cl.refused != "" {
		b = append(b, '!')
	}
	b = append(b, cl.name...)
	for _, s := range sizesOf(cl, n) {
		b = append(b, ' ')
		b = strconv.AppendInt(b, int64(s), 10)
	}
	if cl.refused != "" {
		b = append(b, ' ')
		b = append(b, url.QueryEscape(cutReason(cl.refused))...)
	}
	return b
}

// cutReason is r, as valid UTF-8, cut to at most maxReason bytes at a
// character's start: what every rank reads back from the store.
func cutReason(r string) string {
	r = strings.ToValidUTF8(r, "?")
	if len(r) <= maxReason {
		return r
	}
	n := maxReason
	for n > 0 && !utf8.RuneStart(r[n]) {
		n--
	}
	return r[:n]
}

// decodeCall decodes a call of n ranks read from the store.
func decodeCall(v []byte, n int) (call, error) {
	f := strings.Fields(string(v))
	var cl call
	if len(f) > 0 && strings.HasPrefix(f[0], "!") {
		if len(f) != n+2 {
			return call{}, fmt.Errorf("a refused call of %d fields", len(f))
		}
		r, err := url.QueryUnescape(f[n+1])
		if err != nil || r == "" || len(r) > maxReason || !utf8.ValidString(r) {
			return call{}, fmt.Errorf("a refused call's reason %.128q", f[n+1])
		}
		cl.refused, f[0], f = r, f[0][1:], f[:n+1]
	}
	if len(f) != n+1 || f[0] == "" {
		return call{}, fmt.Errorf("a call of %d fields", len(f))
	}
	cl.name, cl.sizes = f[0], make([]int, n)
	for i := range n {
		s, err := strconv.Atoi(f[i+1])
		if err != nil {
			return call{}, err
		}
		cl.sizes[i] = s
	}
	return cl, nil
}

// differs describes how the ranks' calls differ, the same on every rank:
// the ranks are grouped by call; the group that holds more ranks than
// any other is the reference (without one, rank 0's), and each other
// group is described against it. peer is the first rank of the first
// other group, or, on that rank, the reference's first rank; -1 when
// every call agrees.
func differs(calls []call, me int) (peer int, detail string) {
	return verdict.Differs(calls, me, sameCall, describeDiff)
}

func sameCall(a, b call) bool {
	return a.name == b.name && slices.Equal(a.sizes, b.sizes) && a.refused == b.refused
}

// describeDiff says how call a of ranks ra differs from call b of ranks
// rb: "rank 2 calls barrier, ranks 0 and 1 allgather", "rank 3
// contributes 101 bytes, ranks 0-2 100", "rank 1's counts differ: it
// passed [5 4 3], ranks 0 and 2 [4 4 4]".
func describeDiff(a call, ra []int, b call, rb []int) string {
	one := len(ra) == 1
	verb := func(sing, plur string) string {
		if one {
			return sing
		}
		return plur
	}
	if a.refused != "" || b.refused != "" {
		// A refusal first, with its reason: the sizes of a refused call
		// are nothing the rank passed.
		side := func(cl call, rs []int) string {
			one := len(rs) == 1
			if cl.refused == "" {
				return fmt.Sprintf("%s called %s", verdict.RankList(rs), cl.name)
			}
			whose := "their"
			if one {
				whose = "its"
			}
			return fmt.Sprintf("%s refused %s %s call as invalid: %s", verdict.RankList(rs), whose, cl.name, cl.refused)
		}
		if a.refused == "" {
			return side(b, rb) + "; " + side(a, ra)
		}
		return side(a, ra) + "; " + side(b, rb)
	}
	if a.name != b.name {
		return fmt.Sprintf("%s %s %s, %s %s", verdict.RankList(ra), verb("calls", "call"), a.name, verdict.RankList(rb), b.name)
	}
	if ua, ok := uniform(a.sizes); ok {
		if ub, ok := uniform(b.sizes); ok {
			return fmt.Sprintf("%s %s %d bytes, %s %d", verdict.RankList(ra), verb("contributes", "contribute"), ua, verdict.RankList(rb), ub)
		}
	}
	return fmt.Sprintf("%s's counts differ: %s passed %s, %s %s", verdict.RankList(ra), verb("it", "they"), countList(a.sizes), verdict.RankList(rb), countList(b.sizes))
}

// uniform reports whether every size is the same, and which.
func uniform(s []int) (int, bool) {
	for _, n := range s {
		if n != s[0] {
			return 0, false
		}
	}
	return s[0], len(s) > 0
}

// countList is "[5 4 3]", cut after 16 counts.
func countList(s []int) string {
	const max = 16
	if len(s) <= max {
		return fmt.Sprint(s)
	}
	return strings.TrimSuffix(fmt.Sprint(s[:max]), "]") + " … (" + strconv.Itoa(len(s)) + " counts)]"
}
