package rendezvous

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestSharedKeyWaitsCounted: blocked requests that wait on the same keys
// share one copy of each key, but each holds its own list of them (a
// string header per key): MaxTotalBytes must bound those lists too, or
// conns waits on 65535 short keys hold conns MiB whatever the limit.
func TestSharedKeyWaitsCounted(t *testing.T) {
	const budget = 4 << 20
	s, _ := startCfg(t, ServerConfig{MaxTotalBytes: budget})
	keys := make([]string, MaxCallKeys)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
	}
	frame := (&message{Code: uint8(opWait), Keys: keys, TimeoutMS: 60_000}).encode(nil)
	const conns = 32
	before := heapAfterGC()
	for range conns {
		c := rawConn(t, s, Auth{})
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := c.Write(frame); err != nil {
			t.Fatal(err)
		}
	}
	// Every request is either blocked or answered (refused) by now.
	time.Sleep(2 * time.Second)
	s.mu.Lock()
	w, held := s.waiting, s.waitingKeys
	s.mu.Unlock()
	d := int64(heapAfterGC()) - int64(before)
	if most := int64(budget) + 8<<20; d > most || held > budget { // 8 MiB: the connections' own buffers and the first frame
		t.Fatalf("%d blocked waits on %d shared keys (%d bytes counted, MaxTotalBytes %d) make the server hold %d bytes", w, len(keys), held, budget, d)
	}
	t.Logf("%d of %d waits blocked, %d bytes counted, heap grew %d", w, conns, held, d)
}

// TestBarrierOfManyMembers: a barrier's members each wait on one key, so
// that a barrier of P members costs the store O(P), not P² key slots; it
// still passes only when all have arrived, once per member however often
// a member arrives, and names the members that did not.
//
// P and the first round's deadline are sized for a loaded machine under
// -race: the members all arrive within it, and, when it passes, all look
// for the missing member at once (each a few checks of up to P keys)
// within the check's own bound. P² key slots (16 bytes each, 1 MiB)
// would still be twice MaxTotalBytes.
func TestBarrierOfManyMembers(t *testing.T) {
	const P = 256
	s, dial := startCfg(t, ServerConfig{MaxTotalBytes: 512 << 10})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clients := make([]*Client, P)
	for i := range clients {
		clients[i] = dial()
	}
	// A member that arrives twice (a retry) counts once: P-1 members,
	// one of them twice, do not pass.
	short, scancel := context.WithTimeout(ctx, 3*time.Second)
	var wg sync.WaitGroup
	errs := make([]error, P)
	for i := range P - 1 {
		wg.Go(func() { errs[i] = clients[i].Barrier(short, "b", i, P) })
	}
	wg.Go(func() { errs[P-1] = clients[P-1].Barrier(short, "b", 0, P) })
	// The keys held once every member waits.
	var held int64
	for short.Err() == nil {
		s.mu.Lock()
		w, h := s.waiting, s.waitingKeys
		s.mu.Unlock()
		if w == P {
			held = h
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	wg.Wait()
	scancel()
	for i, err := range errs {
		me, ok := err.(*MissingError)
		if !ok || len(me.Missing) != 1 || me.Missing[0] != P-1 {
			t.Fatalf("member %d: %v; want member %d missing", i, err, P-1)
		}
	}
	if held == 0 {
		t.Errorf("the %d members were never all waiting at once", P)
	} else if held > 64*P {
		t.Errorf("%d members waiting held %d bytes of keys", P, held)
	}
	// The last member arrives: every member passes.
	for i := range P {
		wg.Go(func() { errs[i] = clients[i].Barrier(ctx, "b", i, P) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("member %d: %v", i, err)
		}
	}
}

// TestBarrierAfterUncountedArrival: member 0's first call created its key
// and failed before it counted itself in (its deadline, a lost
// connection): a second call of member 0, with the other members' calls,
// must pass the barrier, as when arriving was one Set. Without that
// second call, the barrier fails at its deadline saying so, not naming
// members "never arrived" that all did.
func TestBarrierAfterUncountedArrival(t *testing.T) {
	_, dial := startCfg(t, ServerConfig{})
	const P = 3
	cs := make([]*Client, P)
	for i := range cs {
		cs[i] = dial()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, name := range []string{"again", "once"} {
		if _, created, err := cs[0].CompareAndSet(ctx, BarrierKey(name, 0), nil, []byte{'1'}); err != nil || !created {
			t.Fatal(created, err)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, P)
	for i := range P {
		wg.Go(func() { errs[i] = cs[i].Barrier(ctx, "again", i, P) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("member %d: %v", i, err)
		}
	}
	short, scancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer scancel()
	for i := 1; i < P; i++ {
		wg.Go(func() { errs[i] = cs[i].Barrier(short, "once", i, P) })
	}
	wg.Wait()
	for i := 1; i < P; i++ {
		var me *MissingError
		// The one not counted in is named (a member stopped in its
		// call, between the two: the error said "one", not which).
		if !errors.As(errs[i], &me) || len(me.Missing) != 0 || !strings.Contains(errs[i].Error(), "every member arrived, but [0] were not counted in") {
			t.Errorf("member %d: %v; want every member arrived, [0] not counted", i, errs[i])
		}
	}
}
