package rendezvous

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestBlockedWaitsDoNotPinMemory: a member that sends, on each of ten
// connections, one Wait on keys that never come (a frame near the limit,
// of legal keys) makes the server hold, for as long as the waits last,
// their keys and no more (not the frames they came in), and only up to
// MaxTotalBytes of keys in all: beyond it a Wait is refused at once.
// The server promises to bound what any client, even one past the
// handshake, can make it hold (doc.go, ServerConfig).
func TestBlockedWaitsDoNotPinMemory(t *testing.T) {
	const budget = 20 << 20
	s, _ := startCfg(t, ServerConfig{MaxTotalBytes: budget})
	const conns = 10
	// Each connection's keys are its own: blocked requests share the
	// copies of the keys they have in common.
	frames := make([][]byte, conns)
	keyBytes := 0
	for c := range conns {
		pad := strings.Repeat(string(rune('a'+c)), MaxKeyBytes-8)
		keys := make([]string, 0, 1500)
		keyBytes = 0
		for i := range cap(keys) {
			keys = append(keys, pad+strconv.Itoa(1e7+i)) // MaxKeyBytes-8+8 bytes: legal
			keyBytes += len(keys[i])
		}
		req := message{Code: uint8(opWait), Keys: keys, TimeoutMS: 60_000}
		frames[c] = req.encode(nil)
		if uint32(len(frames[c])-lengthPrefix) > s.frameLimit {
			t.Fatalf("test frame of %d bytes exceeds the limit %d", len(frames[c]), s.frameLimit)
		}
	}
	heap := heapAfterGC
	before := heap()
	cs := make([]interface{ Close() error }, 0, conns)
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	for i := range conns {
		c := rawConn(t, s, Auth{})
		cs = append(cs, c)
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write(frames[i]); err != nil {
			t.Fatal(err)
		}
	}
	held1 := keyBytes + keySlot*1500 // a wait's keys and its list's slots
	fits := budget / held1           // the waits the budget holds
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.mu.Lock()
		w := s.waiting
		s.mu.Unlock()
		if w == fits || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // the refused ones have been answered
	s.mu.Lock()
	w, held := s.waiting, s.waitingKeys
	s.mu.Unlock()
	if w != fits || held != int64(fits*held1) {
		t.Errorf("%d Waits of %d key bytes each: %d blocked holding %d key bytes, want %d (the %d-byte budget)", conns, keyBytes, w, held, fits, budget)
	}
	frames = nil
	if d, most := int64(heap())-int64(before), int64(fits*held1)+4<<20; d > most {
		t.Errorf("%d Waits blocked, holding %d key bytes in all, make the server hold %d bytes (at most %d expected: their frames are let go)", w, held, d, most)
	}
}
