package rendezvous

import (
	"bytes"
	"testing"
	"time"
)

// TestClientBuffersBounded: after a large value in each direction the
// client holds no frame buffer beyond keepBufBytes, and after small ones it
// keeps the buffers it has, so that small calls allocate none.
func TestClientBuffersBounded(t *testing.T) {
	_, dial := start(t)
	c := dial()
	ctx := ctxT(t, 10*time.Second)
	big := bytes.Repeat([]byte{7}, 4*keepBufBytes)
	if err := c.Set(ctx, "big", big); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(ctx, "big"); err != nil || !bytes.Equal(v, big) {
		t.Fatalf("get big: %v", err)
	}
	if cap(c.buf) > keepBufBytes || cap(c.out) > keepBufBytes {
		t.Errorf("after a %d-byte value the client holds buffers of %d and %d bytes", len(big), cap(c.buf), cap(c.out))
	}
	if err := c.Set(ctx, "small", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, "small"); err != nil {
		t.Fatal(err)
	}
	if cap(c.buf) == 0 || cap(c.out) == 0 {
		t.Errorf("after small calls the client dropped its buffers (%d, %d bytes)", cap(c.buf), cap(c.out))
	}
}
