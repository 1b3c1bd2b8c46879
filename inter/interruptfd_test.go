package inter

import (
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fdOf is c's descriptor number (for the test only: valid while c is open).
func fdOf(t *testing.T, c *net.TCPConn) int {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	fd := -1
	rc.Control(func(f uintptr) { fd = int(f) })
	return fd
}

// TestInterruptLeavesOtherSocketsAlone: once Interrupt has closed a
// transport's sockets, their descriptor numbers are free, and the next
// socket the process opens takes one. The receives that the algorithms
// collect after Interrupt (failDrained's WaitRecv, a connection reader
// that takes its job late) still run their Reader, whose SetLowat makes
// setsockopt(SO_RCVLOWAT) on the descriptor number it kept ("valid while
// c is open"): it must not reach the socket that now holds that number.
func TestInterruptLeavesOtherSocketsAlone(t *testing.T) {
	ts := pairWith(t, Config{Channels: 1})
	// A message of 256 KiB or more that is all there when rank 0 reads
	// it: one read takes the payload, and the connection's low-water mark
	// stays at its size.
	const big = 300_001
	for it := range 4 { // the receive buffer grows (autotuning)
		exchange(t, ts, 8<<20, 10+it)
	}
	dl := time.Now().Add(5 * time.Second)
	ts[1].Send(0, 1, 7, make([]byte, big), dl)
	if err := ts[1].WaitSend(0); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	ts[0].Recv(1, 1, 7, make([]byte, big), dl)
	if err := ts[0].WaitRecv(1); err != nil {
		t.Fatal(err)
	}
	c0 := ts[0].peers[1].conns[0]
	oldFD, cur := fdOf(t, c0.c), c0.rd.cur
	t.Logf("rank 0's socket to rank 1: fd %d, low-water mark %d", oldFD, cur)
	if cur == 1 {
		t.Skip("the last read left the low-water mark at 1: nothing to set")
	}
	n := 1000
	if !ts[0].Direct(n) {
		t.Fatalf("%d bytes not direct", n)
	}
	ts[0].Recv(1, 2, 7, make([]byte, n), time.Now().Add(5*time.Second))
	ts[0].Interrupt() // what ring.Run and hier's failDrained now do

	// Another part of the process opens sockets meanwhile (the store's
	// client redialing, another transport, the program's own).
	var other *net.TCPConn
	for range 8 {
		a, b := tcpPair(t)
		for _, c := range []*net.TCPConn{a, b} {
			if fdOf(t, c) == oldFD {
				other = c
			}
		}
		if other != nil {
			break
		}
	}
	if other == nil {
		t.Skipf("no new socket took fd %d", oldFD)
	}
	const mine = 12345
	rc, _ := other.SyscallConn()
	rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVLOWAT, mine) })

	err := ts[0].WaitRecv(1) // failDrained collecting the receive
	t.Logf("WaitRecv after Interrupt: %v", err)
	if got := rcvlowat(t, other); got != mine {
		t.Errorf("an unrelated socket that took the interrupted connection's fd %d has SO_RCVLOWAT %d, set to %d: the transport's Reader wrote to it after Interrupt closed its own", oldFD, got, mine)
	}
}
