package testflood

import (
	"bytes"
	"io"
	"net"
	"sync"
	"time"

	"github.com/slimego/slimego/internal/auth"
)

// RelayHandshake is a stranger's relay of internal/auth's exchange, who
// holds no secret: between c, a member's connection to the stranger's
// port, and m, the stranger's connection to a listener it chose, it
// passes the listener's hello to c, c's proof to m, and m's answer back
// (a refusal, one byte, as it comes). It reports whether all three passed
// whole: then c's member believes it reached whom it dialed.
func RelayHandshake(c, m net.Conn) bool {
	relay := func(dst io.Writer, src io.Reader, n int) bool {
		buf := make([]byte, n)
		k, err := io.ReadFull(src, buf)
		dst.Write(buf[:k])
		return err == nil
	}
	return relay(c, m, auth.HelloBytes) && relay(m, c, auth.ProofBytes) && relay(c, m, auth.AnswerBytes)
}

// Loot is what a stranger read off a member's connection.
type Loot struct {
	mu sync.Mutex
	b  []byte
}

// Take reads c until it ends or d has passed, keeping every byte.
func (l *Loot) Take(c net.Conn, d time.Duration) {
	c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 256<<10)
	for {
		n, err := c.Read(buf)
		l.mu.Lock()
		l.b = append(l.b, buf[:n]...)
		l.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// Holds reports whether the loot holds b, byte for byte.
func (l *Loot) Holds(b []byte) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Contains(l.b, b)
}
