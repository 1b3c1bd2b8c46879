package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

func start(t *testing.T) (*Server, func() *Client) {
	t.Helper()
	s, err := Listen("127.0.0.1:0", ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, func() *Client {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := Dial(ctx, s.Addr().String(), Auth{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestSetGetBlocks(t *testing.T) {
	_, dial := start(t)
	a, b := dial(), dial()
	ctx := ctxT(t, 5*time.Second)
	got := make(chan []byte, 1)
	go func() {
		v, err := b.Get(ctx, "k")
		if err != nil {
			t.Error(err)
		}
		got <- v
	}()
	time.Sleep(20 * time.Millisecond)
	select {
	case v := <-got:
		t.Fatalf("Get returned %q before Set", v)
	default:
	}
	if err := a.Set(ctx, "k", []byte("value")); err != nil {
		t.Fatal(err)
	}
	if v := <-got; string(v) != "value" {
		t.Fatalf("Get = %q", v)
	}
}

func TestGetTimeout(t *testing.T) {
	_, dial := start(t)
	c := dial()
	start := time.Now()
	_, err := c.Get(ctxT(t, 150*time.Millisecond), "never")
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("timeout took %v", d)
	}
	// The connection is still usable after a server-side timeout.
	if err := c.Set(ctxT(t, time.Second), "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
}

func TestAddConcurrent64(t *testing.T) {
	_, dial := start(t)
	const clients, each = 64, 50
	cs := make([]*Client, clients)
	for i := range cs {
		cs[i] = dial()
	}
	ctx := ctxT(t, 20*time.Second)
	var wg sync.WaitGroup
	seen := make([][]int64, clients)
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				n, err := c.Add(ctx, "ctr", 1)
				if err != nil {
					t.Error(err)
					return
				}
				seen[i] = append(seen[i], n)
			}
		}()
	}
	wg.Wait()
	// Every value 1..clients*each was returned exactly once.
	hit := make([]bool, clients*each+1)
	for _, s := range seen {
		for _, n := range s {
			if n < 1 || int(n) > clients*each || hit[n] {
				t.Fatalf("Add returned %d twice or out of range", n)
			}
			hit[n] = true
		}
	}
	v, err := cs[0].Get(ctx, "ctr")
	if err != nil || string(v) != "3200" {
		t.Fatalf("final counter %q, %v", v, err)
	}
}

func TestCompareAndSet(t *testing.T) {
	_, dial := start(t)
	c := dial()
	ctx := ctxT(t, 5*time.Second)
	cases := []struct {
		expected, desired string
		wantSwap          bool
		wantValue         string
	}{
		{"", "one", true, "one"},    // missing key, empty expected: set
		{"two", "x", false, "one"},  // mismatch: unchanged, current value returned
		{"one", "two", true, "two"}, // match
	}
	for _, tc := range cases {
		v, swapped, err := c.CompareAndSet(ctx, "k", []byte(tc.expected), []byte(tc.desired))
		if err != nil || swapped != tc.wantSwap || string(v) != tc.wantValue {
			t.Errorf("CAS(%q,%q) = %q, %v, %v; want %q, %v", tc.expected, tc.desired, v, swapped, err, tc.wantValue, tc.wantSwap)
		}
	}
	if _, swapped, _ := c.CompareAndSet(ctx, "missing", []byte("x"), []byte("y")); swapped {
		t.Error("CAS on a missing key with non-empty expected swapped")
	}
}

func TestWaitCheckDelete(t *testing.T) {
	_, dial := start(t)
	a, b := dial(), dial()
	ctx := ctxT(t, 5*time.Second)
	done := make(chan error, 1)
	go func() { done <- b.Wait(ctx, "x", "y") }()
	a.Set(ctx, "x", nil)
	if ok, _ := a.Check(ctx, "x", "y"); ok {
		t.Fatal("Check true with y missing")
	}
	select {
	case err := <-done:
		t.Fatalf("Wait returned %v with y missing", err)
	case <-time.After(20 * time.Millisecond):
	}
	a.Set(ctx, "y", []byte{1})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if ok, err := a.Delete(ctx, "x"); !ok || err != nil {
		t.Fatalf("Delete = %v, %v", ok, err)
	}
	if ok, _ := a.Delete(ctx, "x"); ok {
		t.Fatal("second Delete reported the key existed")
	}
	if n, _ := a.NumKeys(ctx); n != 1 {
		t.Fatalf("NumKeys = %d", n)
	}
	if _, err := a.Add(ctx, "y", 1); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("Add on non-integer: %v", err)
	}
}

func TestDialUnreachableNamesAddress(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	_, err := Dial(ctxT(t, 200*time.Millisecond), addr, Auth{})
	if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), addr) {
		t.Fatalf("err = %v; want ErrUnreachable naming %s", err, addr)
	}
}

func TestDialRetriesUntilServerStarts(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	go func() {
		time.Sleep(100 * time.Millisecond)
		s, err := Listen(addr, ServerConfig{})
		if err != nil {
			t.Error(err)
			return
		}
		t.Cleanup(func() { s.Close() })
	}()
	c, err := Dial(ctxT(t, 5*time.Second), addr, Auth{})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}

func TestListenPortInUse(t *testing.T) {
	s, _ := start(t)
	_, err := Listen(s.Addr().String(), ServerConfig{})
	if err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("err = %v", err)
	}
}

func TestServerCloseFailsBlockedCall(t *testing.T) {
	s, dial := start(t)
	c := dial()
	done := make(chan error, 1)
	go func() { _, err := c.Get(ctxT(t, 10*time.Second), "never"); done <- err }()
	time.Sleep(20 * time.Millisecond)
	s.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Get succeeded after Close")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("blocked Get not released by server Close")
	}
}

func TestCancelledCall(t *testing.T) {
	_, dial := start(t)
	c := dial()
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	if _, err := c.Get(ctx, "never"); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
}

func TestBarrierNamesMissing(t *testing.T) {
	_, dial := start(t)
	a, b := dial(), dial()
	done := make(chan error, 2)
	go func() { done <- a.Barrier(ctxT(t, 5*time.Second), "b1", 0, 2) }()
	go func() { done <- b.Barrier(ctxT(t, 5*time.Second), "b1", 1, 2) }()
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	err := a.Barrier(ctxT(t, 100*time.Millisecond), "b2", 1, 4)
	var me *MissingError
	if !errors.As(err, &me) || !errors.Is(err, ErrTimeout) || fmt.Sprint(me.Missing) != "[0 2 3]" {
		t.Fatalf("err = %v", err)
	}
}

func TestShutdownWaitsForClients(t *testing.T) {
	s, dial := start(t)
	c := dial()
	// A connection is the server's once it has answered on it; until then
	// it may still wait in the listener's queue.
	if err := c.Set(ctxT(t, 5*time.Second), "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		c.Close()
	}()
	start := time.Now()
	s.Shutdown(5 * time.Second)
	if d := time.Since(start); d < 80*time.Millisecond || d > 3*time.Second {
		t.Fatalf("Shutdown returned after %v; the client hung up after 100ms", d)
	}
}

// TestDialUnresolvableHostFailsFast: a host name that does not resolve
// fails Dial with ErrUnreachable naming it within about 2 s, not after the
// caller's 30 s deadline. Before, Dial retried the name for the whole
// deadline.
func TestDialUnresolvableHostFailsFast(t *testing.T) {
	const addr = "no-such-host.invalid:29500"
	begin := time.Now()
	_, err := Dial(ctxT(t, 30*time.Second), addr, Auth{})
	if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), "no-such-host.invalid") {
		t.Fatalf("err = %v; want ErrUnreachable naming the host", err)
	}
	if d := time.Since(begin); d > 5*time.Second {
		t.Fatalf("Dial of an unresolvable host took %v", d)
	}
}
