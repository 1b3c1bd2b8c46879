package inter

import "testing"

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
			ts := pairWith(t, c.in)
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
