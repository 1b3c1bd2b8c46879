// Package testflood is a test's attacker: connections that reach a
// listener and never say a word, kept at a number, for tests that prove
// a listener still lets its members in under such a flood.
package testflood

import (
	"errors"
	"net"
	"os"
	"time"
)

// Silent keeps up to n silent TCP connections open to addr, dialing new
// ones as the listener closes old ones, until the returned stop is
// called; stop closes them all and returns once the flood has ended.
func Silent(addr string, n int) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			select {
			case <-quit:
				return
			default:
			}
			if len(conns) < n {
				if c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
					conns = append(conns, c)
					continue
				}
			}
			// Drop the ones the listener gave up on (it closed them).
			live := conns[:0]
			for _, c := range conns {
				c.SetReadDeadline(time.Now().Add(time.Microsecond))
				var b [64]byte
				if _, err := c.Read(b[:]); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
					c.Close()
					continue
				}
				live = append(live, c)
			}
			conns = live
			time.Sleep(5 * time.Millisecond)
		}
	}()
	return func() { close(quit); <-done }
}
