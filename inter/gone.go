package inter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/slimego/slimego/internal/fault"
)

// A rank that gives up on a call closes its connections, and its peers
// see no more than that: in a ring, the ranks beyond a dead rank's two
// neighbours would each name the neighbour whose connection closed, and
// across nodes in hier a rank's node and rail peers would name the rank
// that told them. So before a rank closes its connections, or tells its
// node's ranks, it writes in the store (Record), under the transport's
// key ("gone/<rank>"), the peer it lost or waited for in vain, and what
// it saw. A rank whose wait for peer p failed because p gave up, or came
// to nothing, reads p's record (Explain), follows the records from rank
// to rank to one that has none (it died, or is the late one) or that
// holds itself responsible, and names that rank with the account of the
// rank that saw it (the witness); it then records that rank in its turn,
// so that later readers take fewer steps.
//
// The record is written before the connections close, and a peer reads
// it only after it saw them close, so it finds it (the store serves its
// calls in order). A rank that died wrote nothing, and the peers that
// saw it die name it themselves. Ranks whose waits time out together
// write theirs about the same time: a timed-out wait waits a while for
// the records it follows (goneWait).

// GoneTimeout bounds each part of one rank's account of a failure: its
// look-ups of the records of the ranks it held responsible (Explain, all
// of them together; where a record says its witness waited, goneWait),
// and each of its own records (Record): where the store is slow, or its
// connection busy with another call, a failure reaches the rank's peers
// at most this much later than it would have, and they name the nearer
// rank. A store that is connected but does not
// answer at all (a stopped host) costs the client's answer slack
// (rendezvous: 2 s) on top, once: the client then gives the connection
// up, and the rest fails at once.
const GoneTimeout = 250 * time.Millisecond

// maxGoneReason bounds the account a record carries, in bytes.
const maxGoneReason = 512

// ErrGoneRecord marks a record in the store that is not one.
var ErrGoneRecord = errors.New("inter: malformed failure record")

// goneRecord is one rank's account of why it gave up on a call.
type goneRecord struct {
	culprit int    // the rank it holds responsible
	witness int    // the rank that saw the culprit fail or wait first-hand
	reason  string // what the witness saw
	// waited says the witness's wait for the culprit timed out: the
	// culprit may be waiting in turn, and write a record of its own about
	// now (Explain waits for it).
	waited bool
}

// encode is "culprit witness how\nreason", how being "waited" or "lost".
func (r goneRecord) encode() []byte {
	how := "lost"
	if r.waited {
		how = "waited"
	}
	return []byte(strconv.Itoa(r.culprit) + " " + strconv.Itoa(r.witness) + " " + how + "\n" + clean(r.reason))
}

// decodeGone parses a record read from the store. Both ranks must be
// ranks of the job (below world, where world > 0), and the reason is
// bounded and printable; decodeGone never panics.
func decodeGone(b []byte, world int) (goneRecord, error) {
	var r goneRecord
	if len(b) > maxGoneReason+32 {
		return r, fmt.Errorf("%w: %d bytes", ErrGoneRecord, len(b))
	}
	head, reason, ok := strings.Cut(string(b), "\n")
	if !ok {
		return r, fmt.Errorf("%w: no reason", ErrGoneRecord)
	}
	c, rest, ok := strings.Cut(head, " ")
	w, how, ok2 := strings.Cut(rest, " ")
	if !ok || !ok2 || how != "waited" && how != "lost" {
		return r, fmt.Errorf("%w: %.64q", ErrGoneRecord, head)
	}
	r.waited = how == "waited"
	var err error
	if r.culprit, err = parseRank(c, world); err != nil {
		return r, err
	}
	if r.witness, err = parseRank(w, world); err != nil {
		return r, err
	}
	if len(reason) > maxGoneReason || clean(reason) != reason {
		return r, fmt.Errorf("%w: the reason is not %d bytes of printable text", ErrGoneRecord, maxGoneReason)
	}
	r.reason = reason
	return r, nil
}

func parseRank(s string, world int) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || strconv.Itoa(n) != s || world > 0 && n >= world || n > MaxRank {
		return 0, fmt.Errorf("%w: rank %q is not one of the job's", ErrGoneRecord, s)
	}
	return n, nil
}

// MaxRank bounds a rank read from a failure record where the world size
// is not known.
const MaxRank = 1<<31 - 1

// clean makes s printable and at most maxGoneReason bytes long: invalid
// UTF-8 and control characters become '?', and a longer text is cut at a
// character's start.
func clean(s string) string {
	ok := len(s) <= maxGoneReason && utf8.ValidString(s)
	for _, c := range s {
		if !ok {
			break
		}
		ok = unicode.IsPrint(c)
	}
	if ok {
		return s
	}
	var b strings.Builder
	for _, c := range s {
		if c == utf8.RuneError || !unicode.IsPrint(c) {
			c = '?'
		}
		if b.Len()+utf8.RuneLen(c) > maxGoneReason {
			break
		}
		b.WriteRune(c)
	}
	return b.String()
}

func (t *Transport) goneKey(r int) string { return t.cfg.Key + "/gone/" + strconv.Itoa(r) }

// goneCtx bounds the look-ups of this rank's Explain calls (GoneTimeout
// in all, from the first on; goneWait from now where waiting, once: the
// look-ups of a timed-out wait).
func (t *Transport) goneCtx(waiting bool) (context.Context, context.CancelFunc) {
	t.goneMu.Lock()
	now := time.Now()
	if t.goneBy.IsZero() {
		t.goneBy = now.Add(GoneTimeout)
	}
	if waiting && !t.goneWaited {
		t.goneWaited = true
		if by := now.Add(goneWait(t.cfg.Timeout)); by.After(t.goneBy) {
			t.goneBy = by
		}
	}
	by := t.goneBy
	t.goneMu.Unlock()
	return context.WithDeadline(context.Background(), by)
}

// MaxGoneWait bounds how long a timed-out wait waits for the records of
// the ranks it waited for through (goneWait).
const MaxGoneWait = 5 * time.Second

// goneWait is how long a wait that timed out waits for the records of
// the ranks it waited for through: their own waits, started a little
// earlier or later, time out about now. A quarter of the timeout, at
// least GoneTimeout and at most MaxGoneWait: where the ranks' calls
// started further apart than that, the rank names the peer it waited for.
func goneWait(timeout time.Duration) time.Duration {
	return min(max(timeout/4, GoneTimeout), MaxGoneWait)
}

// Record writes this rank's account of why it gives up: it holds peer
// responsible (this rank itself where peer < 0) for err. A rank records
// first the peer it waited for or lost (before it interrupts the link,
// so that the peers that see it go find it), and then, where Explain
// followed that peer's record to another rank, err is Explain's error and
// the record is written again naming that rank, so that the ranks that
// follow this one's record reach it in fewer steps; nothing after that.
// Record returns once its write, or one under way, has ended, so that no
// caller interrupts the link before the account is in the store. Each
// write takes at most GoneTimeout; a failure to write is dropped: the
// peers then name this rank. A transport without a store keeps the
// account all the same, so that a cancel after it (recordGivingUp) does
// not take its place.
func (t *Transport) Record(peer int, err error) {
	if err == nil {
		return
	}
	r := goneRecord{culprit: peer, witness: t.cfg.Rank, reason: account(err), waited: errors.Is(err, fault.ErrTimeout)}
	var g *goneError
	explained := errors.As(err, &g)
	if explained {
		r = g.rec
	}
	var oe *fault.OpError
	if r.culprit < 0 && errors.As(err, &oe) && oe.Peer >= 0 {
		r.culprit = oe.Peer // a node peer's failure, as the node's gather saw it
	}
	if r.culprit < 0 {
		r.culprit = t.cfg.Rank
	}
	t.put(r, explained)
}

// put writes r as this rank's record, unless it wrote one already that
// r does not replace: a record replaces only one that was not final (an
// explanation, Explain's, is; so is a rank's own giving up,
// recordGivingUp).
func (t *Transport) put(r goneRecord, final bool) {
	t.recordMu.Lock()
	defer t.recordMu.Unlock()
	if t.recorded != nil && (t.recordedFinal || !final || *t.recorded == r) {
		return
	}
	t.recorded, t.recordedFinal = &r, final
	t.write(r)
}

// write puts r in the store, within GoneTimeout (t.recordMu held).
func (t *Transport) write(r goneRecord) {
	if t.cfg.Store == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), GoneTimeout)
	defer cancel()
	_ = t.cfg.Store.Set(ctx, t.goneKey(t.cfg.Rank), r.encode())
}

// maxGoneHops bounds the records one Explain follows.
const maxGoneHops = 32

// Explain is the error, and the rank to name, of a wait for peer p that
// failed with err: where p gave up (fault.ErrPeerLost: its connection
// closed) or was waited for in vain (fault.ErrTimeout), and p recorded
// whom it held responsible, Explain follows the records from rank to
// rank, up to one that has none (it died, or is the late one) or that
// holds itself responsible, and names that rank, with the account of the
// rank that saw it; else p and err. A lost peer's record was written
// before its connections closed, so it is read at once; a timed-out wait
// waits (within GoneTimeout) for the record of a rank whose own wait may
// time out about now: the peer it waited for, and the rank a record says
// its witness waited for. The error keeps err's kind.
func (t *Transport) Explain(p int, err error) (int, error) {
	if err == nil || p < 0 || p == t.cfg.Rank || t.cfg.Store == nil {
		return p, err
	}
	timeout := errors.Is(err, fault.ErrTimeout)
	if !timeout && !errors.Is(err, fault.ErrPeerLost) {
		return p, err
	}
	var g *goneError
	if errors.As(err, &g) {
		return p, err // explained already
	}
	var last *goneRecord // the record that names the rank held responsible
	cur, seen := p, map[int]bool{p: true}
	wait := timeout
	for range maxGoneHops {
		ctx, cancel := t.goneCtx(wait)
		r, ok, derr := t.lookGone(ctx, cur, wait)
		cancel()
		if derr != nil {
			if last == nil {
				return p, fmt.Errorf("%w (rank %d's failure record: %v)", err, cur, derr)
			}
			break
		}
		if !ok {
			break
		}
		last = &r
		if r.culprit == cur || r.culprit == t.cfg.Rank || seen[r.culprit] {
			break // it holds itself responsible, or this rank, or the records go round
		}
		seen[r.culprit] = true
		cur, wait = r.culprit, r.waited
	}
	if last == nil {
		return p, err
	}
	name := last.culprit
	if name == t.cfg.Rank {
		name = p // this rank is the one held responsible: name the peer that gave up on it
	}
	kind := fault.ErrPeerLost
	if timeout {
		kind = fault.ErrTimeout
	}
	return name, &goneError{rec: *last, via: p, here: account(err), me: t.cfg.Rank, kind: kind}
}

// lookGone reads rank r's failure record: at once (wait false: a lost
// peer's record is there before its connections closed), or waiting for
// it until ctx's deadline. ok is false where there is none (by then).
func (t *Transport) lookGone(ctx context.Context, r int, wait bool) (goneRecord, bool, error) {
	key := t.goneKey(r)
	if !wait {
		if ok, err := t.cfg.Store.Check(ctx, key); err != nil || !ok {
			return goneRecord{}, false, nil
		}
	}
	v, err := t.cfg.Store.Get(ctx, key)
	if err != nil {
		return goneRecord{}, false, nil
	}
	rec, err := decodeGone(v, t.cfg.World)
	return rec, err == nil, err
}

// goneError is the error of a wait whose peer gave up, or was held up,
// because of another rank (Explain).
type goneError struct {
	rec  goneRecord
	via  int    // the peer that gave up, or was waited for
	here string // what this rank saw of it
	me   int
	kind error // fault.ErrPeerLost or fault.ErrTimeout
}

func (e *goneError) Error() string {
	who := "rank " + strconv.Itoa(e.rec.culprit)
	if e.rec.culprit == e.me {
		who = "this rank"
	}
	if e.kind == fault.ErrTimeout {
		return fmt.Sprintf("%v: %s, as rank %d saw it (%s), held up this rank's wait for rank %d (here: %s)",
			e.kind, who, e.rec.witness, e.rec.reason, e.via, strings.TrimPrefix(e.here, "timeout: "))
	}
	return fmt.Sprintf("%v: %s, as rank %d saw it (%s); rank %d then gave up (here: %s)",
		e.kind, who, e.rec.witness, e.rec.reason, e.via, strings.TrimPrefix(e.here, "peer lost: "))
}

func (e *goneError) Unwrap() error { return e.kind }

// account is err as a record's reason: without the operation and rank of
// an OpError (the record says whose it is) and without the project's
// prefix.
func account(err error) string {
	s := err.Error()
	var oe *fault.OpError
	if errors.As(err, &oe) {
		s = oe.Err.Error()
		if oe.Detail != "" {
			s += ": " + oe.Detail
		}
	}
	return clean(strings.TrimPrefix(s, "slimego: "))
}
