package inter

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/slimego/slimego/rendezvous"
)

// TestConfigDefaults: a Config that leaves the knobs zero gets the measured
// defaults (DefaultChannels connections per peer, DefaultLowat,
// DefaultSockBuf, DefaultSendCopyMin), and set values are kept; a message
// then crosses.
func TestConfigDefaults(t *testing.T) {
	cases := []struct {
		name string
		in   Config
		want Config
	}{
		{"zero", Config{}, Config{Channels: DefaultChannels, Lowat: DefaultLowat, SockBuf: DefaultSockBuf, SendCopyMin: DefaultSendCopyMin}},
		{"set", Config{Channels: 3, Lowat: -1, SockBuf: 1 << 20, SendCopyMin: -1}, Config{Channels: 3, Lowat: -1, SockBuf: 1 << 20, SendCopyMin: -1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv, err := rendezvous.Listen("127.0.0.1:0", rendezvous.ServerConfig{})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var ts [2]*Transport
			var errs [2]error
			var wg sync.WaitGroup
			for r := range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					store, err := rendezvous.Dial(ctx, srv.Addr().String(), rendezvous.Auth{})
					if err != nil {
						errs[r] = err
						return
					}
					t.Cleanup(func() { store.Close() })
					cfg := c.in
					cfg.Store, cfg.Key, cfg.Rank, cfg.Peers = store, "t", r, []int{1 - r}
					cfg.MasterAddr, cfg.Timeout, cfg.Auth = "127.0.0.1", 10*time.Second, testKey
					ts[r], errs[r] = New(ctx, cfg)
				}()
			}
			wg.Wait()
			for r, err := range errs {
				if err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
				t.Cleanup(func() { ts[r].Close() })
			}
			for r, tr := range ts {
				got := tr.cfg
				if got.Channels != c.want.Channels || got.Lowat != c.want.Lowat || got.SockBuf != c.want.SockBuf || got.SendCopyMin != c.want.SendCopyMin {
					t.Errorf("rank %d: channels %d, lowat %d, sockbuf %d, sendcopymin %d; want %+v", r, got.Channels, got.Lowat, got.SockBuf, got.SendCopyMin, c.want)
				}
				if n := len(tr.peers[1-r].conns); n != c.want.Channels {
					t.Errorf("rank %d: %d connections, want %d", r, n, c.want.Channels)
				}
			}
			exchange(t, ts, 3*StripeMin+1, 1)
		})
	}
}
