package p2p

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestMisuseSendsAhead: a program that sends more messages ahead of the
// peer's receives than the peer holds (maxPendingRTS): the sends past the
// bound fail with ErrRefused saying why (not "too many undelivered
// immediates", an immediate's reason), the receives of their ranks fail
// at once (not at their deadline, waiting for sends that will not come),
// and the sends and receives after them match.
func TestMisuseSendsAhead(t *testing.T) {
	setLimit(t, &maxPendingRTS, 64)
	_, _, ab, ba := pair(t, nil)
	ctx := ctxT(t, 30*time.Second)
	n := maxPendingRTS + 5
	fs := make([]*Future, n)
	for i := range fs {
		fs[i] = ab.Send([]byte{byte(i)})
	}
	time.Sleep(200 * time.Millisecond) // every announcement arrived: the refusals came back
	// Which sends are past the bound depends on the order their
	// announcements arrive over the link's connections: so many are.
	refused := map[int]bool{}
	for i, f := range fs {
		select {
		case <-f.Done():
		default:
			continue
		}
		err := f.Wait(ctx)
		if !errors.Is(err, ErrRefused) || strings.Contains(err.Error(), "immediate") || !strings.Contains(err.Error(), "sends announced") {
			t.Errorf("send %d, done before its receive: %v, want ErrRefused saying too many sends are announced", i, err)
		}
		refused[i] = true
	}
	if len(refused) != n-maxPendingRTS {
		t.Errorf("%d sends refused, want %d", len(refused), n-maxPendingRTS)
	}
	buf := make([]byte, 1)
	for i := range n {
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		t0 := time.Now()
		err := ba.Recv(buf).Wait(c)
		cancel()
		switch {
		case !refused[i] && (err != nil || buf[0] != byte(i)):
			t.Errorf("receive %d: %v %d", i, err, buf[0])
		case refused[i] && !errors.Is(err, ErrRefused):
			t.Errorf("receive %d, whose send was refused: %v after %v, want ErrRefused at once", i, err, time.Since(t0).Round(time.Millisecond))
		}
	}
	for i, f := range fs {
		if err := f.Wait(ctx); err != nil && !refused[i] {
			t.Errorf("send %d: %v", i, err)
		}
	}
	f := ab.Send([]byte{7})
	if err := ba.Recv(buf).Wait(ctx); err != nil || buf[0] != 7 {
		t.Errorf("the pair after: %v %d", err, buf[0])
	}
	if err := f.Wait(ctx); err != nil {
		t.Error(err)
	}
}
