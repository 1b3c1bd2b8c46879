// Package auth proves, on every fresh connection of a job (to the rendezvous
// store, between transports), that both ends hold the job's secret and
// belong to the same job and the same purpose, before anything else is read
// or written. The secret never crosses the wire: each side sends a fresh
// random nonce and an HMAC-SHA256, keyed by the secret, over both nonces,
// the job id and the purpose, under a label of its own role, so that no
// answer can be replayed or reflected.
//
// The exchange, three messages:
//
//	acceptor  → connector: magic, version, nonceA
//	connector → acceptor:  magic, version, nonceC, HMAC(secret, "connector" | purpose | job | nonceA | nonceC)
//	acceptor  → connector: status (0 accepted, 1 denied, 2 not this user's), and when accepted
//	                       HMAC(secret, "acceptor" | purpose | job | nonceC | nonceA)
//
// An empty secret still runs the exchange: it binds a connection to its job
// and purpose (a rank of another job fails at once instead of waiting in the
// wrong store) but proves nothing; callers warn about it across hosts. On
// one host it admits only this user's processes (and root's): where the
// other end of the connection is a socket on this host, in this network
// namespace, the kernel names its owner, and another user's is refused
// (sameUser): by the acceptor once the connector's proof has come (it
// answers statusNotUser, so that the connector knows why), by the
// connector once the acceptor's hello has (it sends nothing more).
package auth

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"
)

// ErrDenied: the handshake failed. Every error of Accept and Connect wraps
// it; those that are a verdict (the peer holds another secret, belongs to
// another job or purpose, or does not speak this protocol) wrap ErrRefused
// too, and those where the connection failed first wrap the I/O error, so
// that a caller can retry those and only those.
var ErrDenied = errors.New("auth: handshake failed")

// ErrRefused: the peer answered, and its answer proves it is not a member of
// this job (or it judged this side not to be one). Retrying cannot help.
var ErrRefused = errors.New("auth: refused")

// ErrNotUser: a refusal (ErrRefused) of a connection between two users'
// processes on one host, for a job with no secret (sameUser).
var ErrNotUser = errors.New("auth: another user's process")

// Key is what both ends of a connection must share.
type Key struct {
	secret []byte
	job    string
}

// NewKey returns the key of the job with this secret (may be empty) and id.
func NewKey(secret []byte, job string) Key {
	return Key{secret: append([]byte(nil), secret...), job: job}
}

// HasSecret reports whether the key holds a secret.
func (k Key) HasSecret() bool { return len(k.secret) > 0 }

// Job is the job id the key binds.
func (k Key) Job() string { return k.job }

const (
	magic = "SLMGAUTH"
	// version 2: the transport's and the p2p engine's purposes name the
	// acceptor, and the acceptor may answer statusNotUser. A peer of
	// another version runs another release: refused, naming both.
	version   = 2
	nonceSize = 32
	macSize   = sha256.Size
	helloSize = len(magic) + 1 + nonceSize
	proofSize = helloSize + macSize

	statusAccepted = 0
	statusDenied   = 1
	// statusNotUser: the proof held, but the key has no secret and the
	// connector is another user's process on the acceptor's host
	// (sameUser). A connector of an earlier version reads any status
	// but 0 as a refusal.
	statusNotUser = 2
)

// The sizes of the exchange's three messages: the acceptor's hello, the
// connector's proof, and the acceptor's answer when it accepts (a refusal
// is its status byte alone).
const (
	HelloBytes  = helloSize
	ProofBytes  = proofSize
	AnswerBytes = 1 + macSize
)

func (k Key) mac(role, purpose string, first, second []byte) []byte {
	m := hmac.New(sha256.New, k.secret)
	var n [4]byte
	for _, s := range []string{role, purpose, k.job} {
		binary.LittleEndian.PutUint32(n[:], uint32(len(s)))
		m.Write(n[:])
		m.Write([]byte(s))
	}
	m.Write(first)
	m.Write(second)
	return m.Sum(nil)
}

func hello(nonce []byte) []byte {
	b := make([]byte, 0, proofSize)
	b = append(b, magic...)
	b = append(b, version)
	return append(b, nonce...)
}

func parseHello(b []byte) ([]byte, error) {
	if string(b[:len(magic)]) != magic {
		return nil, fmt.Errorf("%w: %w: the peer does not speak slimego's handshake", ErrDenied, ErrRefused)
	}
	if b[len(magic)] != version {
		return nil, fmt.Errorf("%w: %w: handshake version %d, want %d (the peer runs another release of slimego: every process of a job must run the same)", ErrDenied, ErrRefused, b[len(magic)], version)
	}
	return b[len(magic)+1 : helloSize], nil
}

func nonce() []byte {
	b := make([]byte, nonceSize)
	rand.Read(b) // never fails on Linux (getrandom)
	return b
}

// Accept runs the acceptor's side on c, which it must finish by deadline.
// On success c's deadline is cleared; on failure the caller closes c.
func Accept(c net.Conn, k Key, purpose string, deadline time.Time) error {
	c.SetDeadline(deadline)
	na := nonce()
	if _, err := c.Write(hello(na)); err != nil {
		return fmt.Errorf("%w: %w", ErrDenied, err)
	}
	var in [proofSize]byte
	if _, err := io.ReadFull(c, in[:]); err != nil {
		return fmt.Errorf("%w: reading the peer's proof: %w", ErrDenied, err)
	}
	nc, err := parseHello(in[:])
	if err != nil {
		return err
	}
	if !hmac.Equal(in[helloSize:], k.mac("connector", purpose, na, nc)) {
		c.Write([]byte{statusDenied})
		return fmt.Errorf("%w: %w: the peer does not hold this job's secret, or belongs to another job (%q) or purpose (%s)", ErrDenied, ErrRefused, k.job, purpose)
	}
	// Checked once the connector has answered, so that it learns why it
	// is refused (and does not take a dropped connection for a store
	// not yet up, and retry).
	if err := sameUser(c, k, "connector"); err != nil {
		c.Write([]byte{statusNotUser})
		return err
	}
	out := append([]byte{statusAccepted}, k.mac("acceptor", purpose, nc, na)...)
	if _, err := c.Write(out); err != nil {
		return fmt.Errorf("%w: %w", ErrDenied, err)
	}
	c.SetDeadline(time.Time{})
	return nil
}

// Connect runs the connector's side on c, which it must finish by deadline.
// On success c's deadline is cleared; on failure the caller closes c.
func Connect(c net.Conn, k Key, purpose string, deadline time.Time) error {
	c.SetDeadline(deadline)
	var in [helloSize]byte
	if _, err := io.ReadFull(c, in[:]); err != nil {
		return fmt.Errorf("%w: reading the acceptor's hello: %w", ErrDenied, err)
	}
	// The acceptor's socket is certainly in the kernel's table once it
	// has written (a connection may be established here before the
	// acceptor's end is).
	if err := sameUser(c, k, "acceptor"); err != nil {
		return err
	}
	na, err := parseHello(in[:])
	if err != nil {
		return err
	}
	nc := nonce()
	out := append(hello(nc), k.mac("connector", purpose, na, nc)...)
	if _, err := c.Write(out); err != nil {
		return fmt.Errorf("%w: %w", ErrDenied, err)
	}
	var st [1]byte
	if _, err := io.ReadFull(c, st[:]); err != nil {
		return fmt.Errorf("%w: reading the acceptor's answer: %w", ErrDenied, err)
	}
	if st[0] == statusNotUser {
		return fmt.Errorf("%w: %w: %w: the acceptor at %s refused this process: the job has no secret, and admits on its host only its own user's processes (give it a secret, SLIME_JOB_SECRET, to admit others)", ErrDenied, ErrRefused, ErrNotUser, c.RemoteAddr())
	}
	if st[0] != statusAccepted {
		return fmt.Errorf("%w: %w: the acceptor refused this job's secret, job id or purpose (%q, %s): the secret (SLIME_JOB_SECRET) or the run id differs, or the listener there is not the one meant", ErrDenied, ErrRefused, k.job, purpose)
	}
	var proof [macSize]byte
	if _, err := io.ReadFull(c, proof[:]); err != nil {
		return fmt.Errorf("%w: reading the acceptor's proof: %w", ErrDenied, err)
	}
	if !hmac.Equal(proof[:], k.mac("acceptor", purpose, nc, na)) {
		return fmt.Errorf("%w: %w: the acceptor does not hold this job's secret", ErrDenied, ErrRefused)
	}
	c.SetDeadline(time.Time{})
	return nil
}

// sameUser refuses, for a key without a secret, a connection whose other
// end (the peer, in role) is another user's socket on this host: with no
// secret, the user is all that tells the job's processes from others'.
// Root's are admitted (root can read any process's memory anyway), and so
// is a peer whose socket this host does not list (another host's, or
// another network namespace's), as before. A peer whose socket the host
// lists closed (its process let go of it: the kernel names no owner) is
// refused: it has left, and what it sent before is nobody's to trust.
func sameUser(c net.Conn, k Key, role string) error {
	if k.HasSecret() {
		return nil
	}
	uid, found, gone := peerUID(c)
	if gone {
		return fmt.Errorf("%w: %w: %w: the %s at %s closed its end before its owner could be checked (a job with no secret admits only its own user's processes on this host)", ErrDenied, ErrRefused, ErrNotUser, role, c.RemoteAddr())
	}
	if me := uint32(os.Geteuid()); found && uid != me && uid != 0 {
		return fmt.Errorf("%w: %w: %w: the %s at %s is a process of uid %d, not this user's (%d): a job with no secret admits only its own user's processes on this host (give it a secret, SLIME_JOB_SECRET, to admit others)", ErrDenied, ErrRefused, ErrNotUser, role, c.RemoteAddr(), uid, me)
	}
	return nil
}
