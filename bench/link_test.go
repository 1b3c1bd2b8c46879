package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/internal/testranks"
)

// TestLinkStalledPeer: rank 1 opens the plain connections and then sends
// nothing; rank 0's duplex transfer must end at the communicator's timeout
// with an error that names both ranks and the operation, not hang.
func TestLinkStalledPeer(t *testing.T) {
	const timeout = 2 * time.Second
	done := make(chan struct{})
	testranks.Run(t, 2, 1, func(o *collective.Options) { o.Timeout = timeout }, func(c *collective.Communicator) error {
		l, err := openLink(context.Background(), c, "127.0.0.1", 2, 0)
		if err != nil {
			return err
		}
		defer l.close()
		if c.Rank() == 1 {
			<-done // stalled: neither reads nor writes
			return nil
		}
		defer close(done)
		n := 1 << 20
		res := make(chan error, 1)
		t0 := time.Now()
		go func() { res <- l.duplex(make([]byte, n), make([]byte, n)) }()
		select {
		case err = <-res:
		case <-time.After(3 * timeout):
			l.close() // ends the transfer, so that the test can report
			return fmt.Errorf("duplex with a stalled peer still waiting after %v", 3*timeout)
		}
		took := time.Since(t0)
		if !errors.Is(err, os.ErrDeadlineExceeded) || !strings.Contains(fmt.Sprint(err), "rank 0 with rank 1") || !strings.Contains(fmt.Sprint(err), "duplex") {
			return fmt.Errorf("duplex with a stalled peer: err = %v, want a deadline error naming ranks 0 and 1 and the duplex transfer", err)
		}
		if took < timeout/2 {
			return fmt.Errorf("duplex with a stalled peer gave up after %v, before the %v timeout", took, timeout)
		}
		return nil
	})
}

// TestLinkWrongPerPlacement: a wrong byte is charged to the placement
// whose gather got it wrong: an in-place gather that does nothing leaves
// the out-of-place row clean (its CSV row was marked wrong too).
func TestLinkWrongPerPlacement(t *testing.T) {
	testHookLinkCheck = func(inPlace bool, run func(context.Context) error) func(context.Context) error {
		if inPlace {
			return func(context.Context) error { return nil } // every rank alike: no peer waits
		}
		return run
	}
	defer func() { testHookLinkCheck = nil }()
	var got []LinkResult
	testranks.Run(t, 2, 1, func(o *collective.Options) { o.Timeout = 30 * time.Second }, func(c *collective.Communicator) error {
		rs, err := Link(context.Background(), c, "127.0.0.1", []int64{4096}, 1, 0, 1, 0, nil)
		if c.Rank() == 0 {
			got = rs
		}
		return err
	})
	if len(got) != 1 {
		t.Fatalf("%d rows, want 1", len(got))
	}
	if r := got[0]; r.Wrong != 0 || r.WrongIn == 0 {
		t.Errorf("out of place %d wrong bytes, in place %d: want 0 and some (only the in-place gather did nothing)", r.Wrong, r.WrongIn)
	}
}
