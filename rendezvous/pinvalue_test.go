package rendezvous

import (
	"bytes"
	"strconv"
	"testing"
	"time"
)

// TestBlockedWaitWithValueDoesNotPinFrame: a Wait (or Get) has no use for
// the value fields, but a client may fill them (up to MaxValueBytes
// each). Blocked, such a request must not keep its frame either
// (doc.go: "one large frame does not pin its memory ... nor while its
// request waits"); nothing counts those bytes against any limit.
func TestBlockedWaitWithValueDoesNotPinFrame(t *testing.T) {
	s, _ := startCfg(t, ServerConfig{})
	const conns = 10
	junk := bytes.Repeat([]byte{1}, DefaultMaxValueBytes)
	heap := heapAfterGC
	before := heap()
	for i := range conns {
		c := rawConn(t, s, Auth{})
		defer c.Close()
		req := message{Code: uint8(opWait), Keys: []string{"never/" + strconv.Itoa(i)}, TimeoutMS: 60_000, Value: junk, Value2: junk}
		if _, err := c.Write(req.encode(nil)); err != nil {
			t.Fatal(err)
		}
	}
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		s.mu.Lock()
		w := s.waiting
		s.mu.Unlock()
		if w == conns || time.Now().After(end) {
			break
		}
	}
	junk = nil
	if d := int64(heap()) - int64(before); d > 4<<20 {
		t.Errorf("%d Waits on one short key each, blocked, make the server hold %d bytes (their frames)", conns, d)
	}
}
