package rendezvous

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/auth"
)

// startCfg starts a server with cfg and returns it and a dialer.
func startCfg(t *testing.T, cfg ServerConfig) (*Server, func() *Client) {
	t.Helper()
	s, err := Listen("127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, func() *Client {
		t.Helper()
		c, err := Dial(ctxT(t, 5*time.Second), s.Addr().String(), cfg.Auth)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
}

// rawConn connects to s and passes the handshake, for tests that write
// frames by hand.
func rawConn(t testing.TB, s *Server, a Auth) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", s.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := auth.Connect(c, a.key(), purpose, time.Now().Add(5*time.Second)); err != nil {
		c.Close()
		t.Fatal(err)
	}
	return c
}

// roundTrip writes req on c and reads the answer, bounded by 5 s.
func roundTrip(t testing.TB, c net.Conn, req message) message {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(req.encode(nil)); err != nil {
		t.Fatal(err)
	}
	resp, err := readFrame(c, new([]byte), frameLimit(maxValueLimit))
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestValueLimits: values above MaxValueBytes and keys above MaxKeyBytes are
// refused with ErrBadRequest, a value too large for a frame too, and the
// same connection and store go on serving.
func TestValueLimits(t *testing.T) {
	const limit = 1000
	_, dial := startCfg(t, ServerConfig{MaxValueBytes: limit})
	c := dial()
	ctx := ctxT(t, 10*time.Second)
	cases := []struct {
		name string
		call func() error
		ok   bool
	}{
		{"set at the limit", func() error { return c.Set(ctx, "a", make([]byte, limit)) }, true},
		{"set above", func() error { return c.Set(ctx, "b", make([]byte, limit+1)) }, false},
		{"cas above", func() error {
			_, _, err := c.CompareAndSet(ctx, "b", nil, make([]byte, limit+1))
			return err
		}, false},
		{"frame above the frame limit", func() error { return c.Set(ctx, "b", make([]byte, 5<<20)) }, false},
		{"key above MaxKeyBytes", func() error { return c.Set(ctx, strings.Repeat("k", MaxKeyBytes+1), nil) }, false},
		{"key at MaxKeyBytes", func() error { return c.Set(ctx, strings.Repeat("k", MaxKeyBytes), nil) }, true},
	}
	for _, tc := range cases {
		err := tc.call()
		if tc.ok && err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		if !tc.ok && !errors.Is(err, ErrBadRequest) {
			t.Errorf("%s: err = %v, want ErrBadRequest", tc.name, err)
		}
		// The store still serves, on the same connection.
		if v, err := c.Get(ctx, "a"); err != nil || len(v) != limit {
			t.Fatalf("after %s: Get = %d bytes, %v", tc.name, len(v), err)
		}
	}
	if ok, _ := c.Check(ctx, "b"); ok {
		t.Error("a refused value was stored")
	}
}

// TestOversizeFrameNotAllocated: a frame that announces 64 MiB is refused
// (statusBadRequest) without the server allocating it, and the connection
// stays usable. Before the limits the server allocated every announced
// frame up to 64 MiB and kept it for the connection's life.
func TestOversizeFrameNotAllocated(t *testing.T) {
	s, _ := startCfg(t, ServerConfig{})
	c := rawConn(t, s, Auth{})
	defer c.Close()
	const announced = 64 << 20
	chunk := make([]byte, 1<<20)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	var lp [lengthPrefix]byte
	binary.LittleEndian.PutUint32(lp[:], announced)
	if _, err := c.Write(lp[:]); err != nil {
		t.Fatal(err)
	}
	for range announced / len(chunk) {
		if _, err := c.Write(chunk); err != nil {
			t.Fatalf("the server stopped reading the oversize frame: %v", err)
		}
	}
	resp, err := readFrame(c, new([]byte), frameLimit(maxValueLimit))
	if err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if resp.Code != statusBadRequest || !bytes.Contains(resp.Value, []byte("exceeds")) {
		t.Fatalf("answer %d %q, want statusBadRequest", resp.Code, resp.Value)
	}
	if d := after.TotalAlloc - before.TotalAlloc; d > 8<<20 {
		t.Fatalf("refusing a 64 MiB frame allocated %d bytes", d)
	}
	if resp := roundTrip(t, c, message{Code: uint8(opSet), Keys: []string{"k"}, Value: []byte("v")}); resp.Code != statusOK {
		t.Fatalf("set after the refused frame: status %d %q", resp.Code, resp.Value)
	}
}

// TestStalledFrameDropped: a client that sends half a frame and stalls is
// dropped after FrameTimeout while another client is served throughout;
// a client idle between frames for longer than FrameTimeout is kept.
func TestStalledFrameDropped(t *testing.T) {
	const frameTimeout = 200 * time.Millisecond
	s, dial := startCfg(t, ServerConfig{FrameTimeout: frameTimeout})
	good, idle := dial(), dial()
	ctx := ctxT(t, 10*time.Second)
	if err := idle.Set(ctx, "idle", nil); err != nil {
		t.Fatal(err)
	}
	staller := rawConn(t, s, Auth{})
	defer staller.Close()
	frame := (&message{Code: uint8(opSet), Keys: []string{"k"}, Value: make([]byte, 100)}).encode(nil)
	if _, err := staller.Write(frame[:len(frame)/2]); err != nil {
		t.Fatal(err)
	}
	dropped := make(chan error, 1)
	go func() {
		staller.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := staller.Read(make([]byte, 1))
		dropped <- err
	}()
	for served := 0; ; served++ {
		select {
		case err := <-dropped:
			if !errors.Is(err, io.EOF) {
				t.Fatalf("stalled client: read %v, want EOF (dropped by the server)", err)
			}
			if served == 0 {
				t.Fatal("no request served while the staller waited")
			}
			// Idle longer than FrameTimeout between frames: still served.
			if err := idle.Set(ctx, "idle", []byte("again")); err != nil {
				t.Fatalf("idle client dropped: %v", err)
			}
			return
		default:
		}
		if _, err := good.Add(ctx, "n", 1); err != nil {
			t.Fatalf("good client not served while another stalled: %v", err)
		}
	}
}

// TestSilentConnClosedAfterHandshakeTimeout: a connection that sends
// nothing is closed after HandshakeTimeout, and other clients are served
// meanwhile.
func TestSilentConnClosedAfterHandshakeTimeout(t *testing.T) {
	s, dial := startCfg(t, ServerConfig{HandshakeTimeout: 200 * time.Millisecond})
	silent, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	c := dial()
	if err := c.Set(ctxT(t, 5*time.Second), "k", nil); err != nil {
		t.Fatal(err)
	}
	silent.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = io.Copy(io.Discard, silent) // the hello, then EOF
	if err != nil {
		t.Fatalf("silent connection: %v, want closed by the server", err)
	}
}

// TestStoreLimits: MaxKeys and MaxTotalBytes refuse sets (Set, Add,
// CompareAndSet of new keys) beyond them, not overwrites that fit, and
// deletes make room again.
func TestStoreLimits(t *testing.T) {
	ctx := ctxT(t, 10*time.Second)
	t.Run("keys", func(t *testing.T) {
		_, dial := startCfg(t, ServerConfig{MaxKeys: 3})
		c := dial()
		steps := []struct {
			name string
			call func() error
			ok   bool
		}{
			{"k0", func() error { return c.Set(ctx, "k0", nil) }, true},
			{"k1", func() error { return c.Set(ctx, "k1", nil) }, true},
			{"k2", func() error { _, err := c.Add(ctx, "k2", 1); return err }, true},
			{"k3 beyond", func() error { return c.Set(ctx, "k3", nil) }, false},
			{"add k3 beyond", func() error { _, err := c.Add(ctx, "k3", 1); return err }, false},
			{"cas k3 beyond", func() error { _, _, err := c.CompareAndSet(ctx, "k3", nil, []byte("x")); return err }, false},
			{"overwrite k0", func() error { return c.Set(ctx, "k0", []byte("x")) }, true},
			{"delete k1", func() error { _, err := c.Delete(ctx, "k1"); return err }, true},
			{"k3 after delete", func() error { return c.Set(ctx, "k3", nil) }, true},
		}
		for _, st := range steps {
			if err := st.call(); st.ok != (err == nil) || (err != nil && !errors.Is(err, ErrBadRequest)) {
				t.Errorf("%s: err = %v, want ok=%v or ErrBadRequest", st.name, err, st.ok)
			}
		}
	})
	t.Run("bytes", func(t *testing.T) {
		_, dial := startCfg(t, ServerConfig{MaxTotalBytes: 100})
		c := dial()
		steps := []struct {
			name string
			call func() error
			ok   bool
		}{
			{"a=50", func() error { return c.Set(ctx, "a", make([]byte, 49)) }, true}, // 50
			{"b=50", func() error { return c.Set(ctx, "b", make([]byte, 49)) }, true}, // 100
			{"c beyond", func() error { return c.Set(ctx, "c", nil) }, false},         // 101
			{"a grows beyond", func() error { return c.Set(ctx, "a", make([]byte, 50)) }, false},
			{"a shrinks", func() error { return c.Set(ctx, "a", make([]byte, 9)) }, true}, // 60
			{"c fits", func() error { return c.Set(ctx, "c", make([]byte, 39)) }, true},   // 100
			{"delete b", func() error { _, err := c.Delete(ctx, "b"); return err }, true}, // 50
			{"d fits", func() error { return c.Set(ctx, "d", make([]byte, 49)) }, true},   // 100
		}
		for _, st := range steps {
			if err := st.call(); st.ok != (err == nil) || (err != nil && !errors.Is(err, ErrBadRequest)) {
				t.Errorf("%s: err = %v, want ok=%v or ErrBadRequest", st.name, err, st.ok)
			}
		}
	})
}

// TestMaxConns: beyond MaxConns a new connection is closed at once; its
// Dial keeps trying (a full store is no verdict on its secret) until its
// deadline, and is never ErrDenied; once a client hangs up, a new one gets
// in.
func TestMaxConns(t *testing.T) {
	s, dial := startCfg(t, ServerConfig{MaxConns: 2})
	a, b := dial(), dial()
	ctx := ctxT(t, 10*time.Second)
	for _, c := range []*Client{a, b} {
		if err := c.Set(ctx, "k", nil); err != nil { // served: the server's
			t.Fatal(err)
		}
	}
	begin := time.Now()
	c, err := Dial(ctxT(t, time.Second), s.Addr().String(), Auth{})
	if err == nil {
		c.Close()
		t.Fatal("a third client got in with MaxConns 2")
	}
	if errors.Is(err, ErrDenied) || !errors.Is(err, ErrUnreachable) {
		t.Fatalf("a full store: %v, want ErrUnreachable at the deadline, not ErrDenied", err)
	}
	if d := time.Since(begin); d > 10*time.Second {
		t.Fatalf("the refused Dial took %v", d)
	}
	if err := a.Set(ctx, "k", []byte("still")); err != nil {
		t.Fatalf("a served client lost its connection: %v", err)
	}
	b.Close()
	// The server notices b's hang-up asynchronously: retry until it has.
	for {
		c, err := Dial(ctxT(t, 5*time.Second), s.Addr().String(), Auth{})
		if err == nil {
			c.Close()
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("no room after a client hung up: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// FuzzServer writes arbitrary bytes, after a good handshake, at a live
// server, then checks that the server still answers a fresh good client
// and that Close returns: no panic, no hang.
func FuzzServer(f *testing.F) {
	f.Add((&message{Code: uint8(opSet), Keys: []string{"k"}, Value: []byte("v")}).encode(nil))
	f.Add((&message{Code: uint8(opGet), Keys: []string{"never"}, TimeoutMS: 1 << 30}).encode(nil))
	f.Add((&message{Code: uint8(opAbort), Keys: []string{""}, N: 1, Value: []byte("why")}).encode(nil))
	f.Add((&message{Code: uint8(opAdd), Keys: []string{"k"}, N: 1}).encode(nil))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, wireVersion, 1})
	f.Add([]byte{0x10, 0, 0, 0, wireVersion})
	f.Fuzz(func(t *testing.T, in []byte) {
		s, err := Listen("127.0.0.1:0", ServerConfig{FrameTimeout: 100 * time.Millisecond, MaxValueBytes: 4 << 10})
		if err != nil {
			t.Fatal(err)
		}
		c := rawConn(t, s, Auth{})
		c.SetDeadline(time.Now().Add(2 * time.Second))
		c.Write(in)
		// Read whatever comes back briefly, then hang up.
		c.SetReadDeadline(time.Now().Add(5 * time.Millisecond))
		io.Copy(io.Discard, c)
		c.Close()

		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		good, err := Dial(ctx, s.Addr().String(), Auth{})
		if err != nil {
			t.Fatalf("a fresh client cannot connect: %v", err)
		}
		if err := good.Set(ctx, "fuzz/check", []byte("ok")); err != nil {
			t.Fatalf("set after %x: %v", in, err)
		}
		if v, err := good.Get(ctx, "fuzz/check"); err != nil || string(v) != "ok" {
			t.Fatalf("get after %x: %q, %v", in, v, err)
		}
		good.Close()
		closed := make(chan struct{})
		go func() { s.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(5 * time.Second):
			t.Fatalf("Close hung after %x", in)
		}
	})
}

// heapAfterGC is the heap in use once a collection has run: what the
// process holds, for the tests that bound it.
func heapAfterGC() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestLargeFramesDoNotPinMemory: connections that each sent one large
// frame and then stay open idle (as ranks do for the whole job) hold no
// frame-sized buffers. The frames here are refused values, so that the
// store itself keeps nothing of them.
func TestLargeFramesDoNotPinMemory(t *testing.T) {
	s, _ := startCfg(t, ServerConfig{})
	const conns = 20
	value := make([]byte, DefaultMaxValueBytes+1) // fits a frame, refused
	heap := heapAfterGC
	before := heap()
	cs := make([]net.Conn, conns)
	for i := range cs {
		cs[i] = rawConn(t, s, Auth{})
		defer cs[i].Close()
		if resp := roundTrip(t, cs[i], message{Code: uint8(opSet), Keys: []string{"k"}, Value: value}); resp.Code != statusBadRequest {
			t.Fatalf("oversize value: status %d", resp.Code)
		}
	}
	if d := int64(heap()) - int64(before); d > 5<<20 {
		t.Fatalf("%d idle connections that each sent a %d-byte frame hold %d bytes", conns, len(value), d)
	}
}

// TestSilentConnsDoNotLockOut: connections that never start their
// handshake, more of them than MaxConns, do not keep a member out: once
// they are evictAge old, the oldest makes room for a new connection.
func TestSilentConnsDoNotLockOut(t *testing.T) {
	s, _ := startCfg(t, ServerConfig{MaxConns: 32, HandshakeTimeout: time.Minute})
	for range 100 {
		c, err := net.Dial("tcp", s.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	// The server has taken all it can once it refuses the next one.
	waitFor(t, s, "the server full", func() bool { return len(s.conns) == 32 })
	time.Sleep(s.evictAge()) // the silent handshakes age past evictAge
	c, err := Dial(ctxT(t, 10*time.Second), s.Addr().String(), Auth{})
	if err != nil {
		t.Fatalf("a member locked out by silent connections: %v", err)
	}
	defer c.Close()
	if err := c.Set(ctxT(t, 5*time.Second), "k", nil); err != nil {
		t.Fatal(err)
	}
}

// TestOnRefused: OnRefused is called for a client whose proof is refused
// (another secret), naming its address, and not for a member, nor for a
// connection that goes silent or closes mid-handshake.
func TestOnRefused(t *testing.T) {
	var mu sync.Mutex
	var refused []string
	cfg := ServerConfig{Auth: Auth{Secret: []byte("right"), Job: "j"}, HandshakeTimeout: 200 * time.Millisecond,
		OnRefused: func(remote string, err error) {
			mu.Lock()
			defer mu.Unlock()
			refused = append(refused, remote+": "+err.Error())
		}}
	s, dial := startCfg(t, cfg)
	dial() // a member
	if c, err := net.Dial("tcp", s.Addr().String()); err == nil {
		c.Close() // closes mid-handshake
	}
	silent, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	wrong, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer wrong.Close()
	if err := auth.Connect(wrong, auth.NewKey([]byte("wrong"), "j"), purpose, time.Now().Add(5*time.Second)); err == nil {
		t.Fatal("a client with another secret got in")
	}
	time.Sleep(400 * time.Millisecond) // past the silent one's handshake timeout
	mu.Lock()
	defer mu.Unlock()
	if len(refused) != 1 || !strings.HasPrefix(refused[0], wrong.LocalAddr().String()+": ") {
		t.Fatalf("refused %q; want the client of another secret alone (%s)", refused, wrong.LocalAddr())
	}
}
