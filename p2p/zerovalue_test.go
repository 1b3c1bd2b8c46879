package p2p

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestMisuseZeroValues: the calls of an Endpoint or a Peer that New or
// Connect did not make (a zero value, or nil) fail with ErrInvalid, and
// their Futures likewise, where they panicked (a Peer{}'s Write: a nil
// pointer; an Endpoint{}'s Register: a nil map).
func TestMisuseZeroValues(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	buf := make([]byte, 8)
	for _, e := range []*Endpoint{{}, nil} {
		if _, err := e.Register("r", buf); !errors.Is(err, ErrInvalid) {
			t.Errorf("Register: %v, want ErrInvalid", err)
		}
		if err := e.Deregister(ctx, nil); !errors.Is(err, ErrInvalid) {
			t.Errorf("Deregister: %v, want ErrInvalid", err)
		}
		if err := e.Publish(ctx); !errors.Is(err, ErrInvalid) {
			t.Errorf("Publish: %v, want ErrInvalid", err)
		}
		if _, err := e.Connect(ctx, "x"); !errors.Is(err, ErrInvalid) {
			t.Errorf("Connect: %v, want ErrInvalid", err)
		}
		if _, err := e.ConnectInfo(ctx, nil); !errors.Is(err, ErrInvalid) {
			t.Errorf("ConnectInfo: %v, want ErrInvalid", err)
		}
		if _, err := e.Imm(ctx); !errors.Is(err, ErrInvalid) {
			t.Errorf("Imm: %v, want ErrInvalid", err)
		}
		if b := e.Info(); b != nil {
			t.Errorf("Info: %d bytes, want none", len(b))
		}
		if p := e.Peer("x"); p != nil {
			t.Errorf("Peer: %v, want nil", p)
		}
		if err := e.Close(); !errors.Is(err, ErrInvalid) {
			t.Errorf("Close: %v, want ErrInvalid", err)
		}
	}
	for _, p := range []*Peer{{}, nil} {
		for name, f := range map[string]*Future{
			"Read": p.Read(nil), "Write": p.Write(nil), "WriteWithImm": p.WriteWithImm(nil, 1),
			"Send": p.Send(buf), "Recv": p.Recv(buf),
		} {
			if err := f.Wait(ctx); !errors.Is(err, ErrInvalid) {
				t.Errorf("%s: %v, want ErrInvalid", name, err)
			}
		}
		if _, err := p.Imm(ctx); !errors.Is(err, ErrInvalid) {
			t.Errorf("Imm: %v, want ErrInvalid", err)
		}
		if tr := p.Transport(); tr != "" {
			t.Errorf("Transport: %q, want none", tr)
		}
		if _, ok := p.Remote("x"); ok {
			t.Error("Remote found a region")
		}
	}
}
