package auth

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// pair returns both ends of a loopback TCP connection.
func pair(t *testing.T) (acceptor, connector net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			t.Error(err)
		}
		got <- c
	}()
	connector, err = net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	acceptor = <-got
	if acceptor == nil {
		t.FailNow()
	}
	t.Cleanup(func() { acceptor.Close(); connector.Close() })
	return acceptor, connector
}

// recorder keeps a copy of everything written through a conn.
type recorder struct {
	net.Conn
	wrote bytes.Buffer
}

func (r *recorder) Write(b []byte) (int, error) {
	r.wrote.Write(b)
	return r.Conn.Write(b)
}

type side struct {
	key     Key
	purpose string
}

// run runs Accept and Connect on a fresh pair, both bounded by 5 s.
func run(t *testing.T, acc, con side) (accErr, conErr error) {
	t.Helper()
	a, c := pair(t)
	deadline := time.Now().Add(5 * time.Second)
	done := make(chan error, 1)
	go func() {
		err := Accept(a, acc.key, acc.purpose, deadline)
		if err != nil {
			a.Close() // as callers do: the connector then sees EOF, not a hang
		}
		done <- err
	}()
	conErr = Connect(c, con.key, con.purpose, deadline)
	if conErr != nil {
		c.Close()
	}
	return <-done, conErr
}

// TestHandshake: the same key and purpose pass both ways; a different
// secret, job id or purpose is denied on both sides, the connector told
// that the acceptor refused it and the acceptor saying what the peer
// lacks.
func TestHandshake(t *testing.T) {
	base := side{NewKey([]byte("s3cret"), "job1"), "rendezvous"}
	cases := []struct {
		name    string
		con     side
		wantErr bool
	}{
		{"same key", base, false},
		{"empty secret both sides", side{NewKey(nil, "job1"), "rendezvous"}, true}, // base has a secret
		{"different secret", side{NewKey([]byte("other"), "job1"), "rendezvous"}, true},
		{"different job", side{NewKey([]byte("s3cret"), "job2"), "rendezvous"}, true},
		{"different purpose", side{NewKey([]byte("s3cret"), "job1"), "transport"}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			accErr, conErr := run(t, base, tc.con)
			if !tc.wantErr {
				if accErr != nil || conErr != nil {
					t.Fatalf("accept: %v; connect: %v", accErr, conErr)
				}
				return
			}
			if !errors.Is(conErr, ErrDenied) || !strings.Contains(conErr.Error(), "refused") {
				t.Errorf("connector: %v, want ErrDenied saying the acceptor refused", conErr)
			}
			if !errors.Is(accErr, ErrDenied) || !strings.Contains(accErr.Error(), "does not hold this job's secret") {
				t.Errorf("acceptor: %v, want ErrDenied saying what the peer lacks", accErr)
			}
		})
	}
	// An empty secret on both sides binds job and purpose.
	empty := side{NewKey(nil, "job1"), "rendezvous"}
	if a, c := run(t, empty, empty); a != nil || c != nil {
		t.Fatalf("empty secrets: accept %v, connect %v", a, c)
	}
}

// TestHandshakeGarbage: a peer that does not speak the protocol (garbage,
// a wrong magic, another version), hangs up early, or stays silent is
// denied, and a silent one no later than the deadline.
func TestHandshakeGarbage(t *testing.T) {
	k := NewKey([]byte("s3cret"), "job1")
	good := hello(make([]byte, nonceSize))
	wrongMagic := append([]byte("HTTP/1.1"), good[len(magic):]...)
	wrongVersion := append([]byte{}, good...)
	wrongVersion[len(magic)] = version + 1
	garbage := bytes.Repeat([]byte{0xA5}, proofSize)
	cases := []struct {
		name string
		send []byte // what the peer sends (then it waits); nil: silent
		hang bool   // hang up after sending
		want string // in the error
	}{
		{"garbage", garbage, false, "does not speak"},
		{"wrong magic", wrongMagic, false, "does not speak"},
		{"wrong version", wrongVersion, false, "version"},
		{"hangs up mid-message", good[:10], true, "reading"}, // EOF or reset
		{"silent", nil, false, "timeout"},
	}
	for _, tc := range cases {
		for _, role := range []string{"acceptor", "connector"} {
			t.Run(tc.name+"/"+role, func(t *testing.T) {
				me, peer := pair(t)
				go func() {
					// The peer reads what it is sent (so that writes never
					// block), and sends its bytes.
					go io.Copy(io.Discard, peer)
					if tc.send != nil {
						// An acceptor reads a proof-sized message, a
						// connector a hello.
						msg := tc.send
						if role == "connector" && len(msg) > helloSize {
							msg = msg[:helloSize]
						}
						if role == "acceptor" && len(msg) == helloSize {
							msg = append(append([]byte{}, msg...), make([]byte, macSize)...)
						}
						peer.Write(msg)
					}
					if tc.hang {
						peer.Close()
					}
				}()
				begin := time.Now()
				var err error
				deadline := time.Now().Add(300 * time.Millisecond)
				if role == "acceptor" {
					err = Accept(me, k, "rendezvous", deadline)
				} else {
					err = Connect(me, k, "rendezvous", deadline)
				}
				if !errors.Is(err, ErrDenied) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("err = %v, want ErrDenied mentioning %q", err, tc.want)
				}
				if d := time.Since(begin); d > 5*time.Second {
					t.Fatalf("denied after %v; the deadline was 300ms", d)
				}
			})
		}
	}
}

// TestHandshakeReplay: the bytes of one good exchange, replayed on a new
// connection, are denied: each side's nonce is fresh, so a recorded proof
// answers a challenge that is never asked again. Both directions: a
// connector's proof replayed to an acceptor, and an acceptor's hello and
// proof replayed to a connector.
func TestHandshakeReplay(t *testing.T) {
	k := NewKey([]byte("s3cret"), "job1")
	const p = "rendezvous"
	a, c := pair(t)
	ra, rc := &recorder{Conn: a}, &recorder{Conn: c}
	deadline := time.Now().Add(5 * time.Second)
	done := make(chan error, 1)
	go func() { done <- Accept(ra, k, p, deadline) }()
	if err := Connect(rc, k, p, deadline); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	connectorBytes := rc.wrote.Bytes() // nonceC and its proof
	acceptorBytes := ra.wrote.Bytes()  // hello, status and proof
	if len(connectorBytes) != proofSize || len(acceptorBytes) != helloSize+1+macSize {
		t.Fatalf("recorded %d and %d bytes", len(connectorBytes), len(acceptorBytes))
	}

	t.Run("connector's proof to a new acceptor", func(t *testing.T) {
		a, peer := pair(t)
		go func() {
			io.ReadFull(peer, make([]byte, helloSize)) // the new, unseen challenge
			peer.Write(connectorBytes)
			io.Copy(io.Discard, peer)
		}()
		if err := Accept(a, k, p, time.Now().Add(5*time.Second)); !errors.Is(err, ErrDenied) {
			t.Fatalf("replayed connector proof: %v, want ErrDenied", err)
		}
	})
	t.Run("acceptor's proof to a new connector", func(t *testing.T) {
		c, peer := pair(t)
		go func() {
			peer.Write(acceptorBytes[:helloSize])
			io.ReadFull(peer, make([]byte, proofSize)) // the new connector's proof
			peer.Write(acceptorBytes[helloSize:])
			io.Copy(io.Discard, peer)
		}()
		err := Connect(c, k, p, time.Now().Add(5*time.Second))
		if !errors.Is(err, ErrDenied) || !strings.Contains(err.Error(), "acceptor does not hold") {
			t.Fatalf("replayed acceptor proof: %v, want ErrDenied", err)
		}
	})
}

// FuzzHandshake feeds arbitrary bytes to both sides of the handshake as
// the peer's messages: neither may panic or accept them.
func FuzzHandshake(f *testing.F) {
	f.Add(hello(make([]byte, nonceSize)))
	f.Add(append(hello(make([]byte, nonceSize)), make([]byte, macSize+1)...))
	f.Add([]byte("SLMGAUTH"))
	k := NewKey([]byte("s3cret"), "job1")
	f.Fuzz(func(t *testing.T, in []byte) {
		for _, role := range []string{"acceptor", "connector"} {
			me, peer := net.Pipe()
			go func() {
				go io.Copy(io.Discard, peer)
				peer.Write(in)
				peer.Close()
			}()
			deadline := time.Now().Add(time.Second)
			var err error
			if role == "acceptor" {
				err = Accept(me, k, "rendezvous", deadline)
			} else {
				err = Connect(me, k, "rendezvous", deadline)
			}
			me.Close()
			if !errors.Is(err, ErrDenied) {
				t.Fatalf("%s accepted %x: %v", role, in, err)
			}
		}
	})
}
