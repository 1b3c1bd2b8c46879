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
