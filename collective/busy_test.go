package collective_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/collective"
)

// TestTwoGoroutines: a communicator is driven by one goroutine at a time.
// A call made while another goroutine's call is in progress is refused at
// once (ErrInvalid), touching nothing, and Close from another goroutine
// waits for the call in progress to return instead of pulling its memory
// from under it; the call in progress then completes with the right data.
// Within a node and across nodes.
func TestTwoGoroutines(t *testing.T) {
	for _, layout := range [][2]int{{1, 2}, {2, 1}} {
		t.Run(fmt.Sprintf("%dx%d", layout[0], layout[1]), func(t *testing.T) {
			go1 := make(chan struct{}) // rank 1 may call
			inProcessNodes(t, layout[0], layout[1], nil, func(c *collective.Communicator) error {
				ctx := context.Background()
				const n = 4096
				src := bytes.Repeat([]byte{byte(c.Rank() + 1)}, n)
				dst := make([]byte, 2*n)
				want := append(bytes.Repeat([]byte{1}, n), bytes.Repeat([]byte{2}, n)...)
				if c.Rank() == 1 {
					<-go1
					if err := c.AllGather(ctx, dst, src); err != nil {
						return err
					}
					if !bytes.Equal(dst, want) {
						return errors.New("rank 1: wrong data")
					}
					return nil
				}
				first := make(chan error, 1)
				go func() { first <- c.AllGather(ctx, dst, src) }() // waits for rank 1
				time.Sleep(200 * time.Millisecond)
				err := c.AllGather(ctx, make([]byte, 2*n), src)
				var oe *collective.OpError
				if !errors.Is(err, collective.ErrInvalid) || !errors.As(err, &oe) || !strings.Contains(oe.Detail, "another goroutine") {
					close(go1)
					return fmt.Errorf("a second goroutine's AllGather during the first's: %v, want ErrInvalid", err)
				}
				closed := make(chan error, 1)
				go func() { closed <- c.Close() }()
				select {
				case err := <-closed:
					close(go1)
					return fmt.Errorf("Close returned (%v) while another goroutine's AllGather was in progress", err)
				case <-time.After(200 * time.Millisecond):
				}
				close(go1)
				if err := <-first; err != nil {
					return fmt.Errorf("the first AllGather: %w", err)
				}
				if !bytes.Equal(dst, want) {
					return errors.New("rank 0: wrong data")
				}
				if err := <-closed; err != nil {
					return fmt.Errorf("Close: %w", err)
				}
				if err := c.AllGather(ctx, dst, src); !errors.Is(err, collective.ErrClosed) {
					return fmt.Errorf("AllGather after Close: %v, want ErrClosed", err)
				}
				return nil
			})
		})
	}
}
