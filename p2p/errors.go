package p2p

import (
	"context"
	"errors"
	"fmt"
)

// The sentinels every error of this package wraps; test with errors.Is.
var (
	// ErrRefused: the target refused a request (outside a registered
	// region, a wrong key, a region never registered or deregistered, a
	// message larger than the posted receive), or refused the connection.
	// Nothing was read or written, except by a WriteWithImm whose
	// immediate a full queue of undelivered immediates refused (its error
	// says so): its bytes are in place, its immediate not delivered.
	ErrRefused = errors.New("p2p: refused")
	// ErrTimeout: a deadline passed (the call's context, Options.Timeout,
	// or the heartbeat deadline of a link gone silent).
	ErrTimeout = errors.New("p2p: timeout")
	// ErrPeerLost: the peer's process exited or its connection closed.
	ErrPeerLost = errors.New("p2p: peer lost")
	// ErrInvalid: an argument is wrong on this side alone (an operation
	// outside a local region, a batch too large, a malformed Info).
	ErrInvalid = errors.New("p2p: invalid argument")
	// ErrClosed: the endpoint was closed, or the region deregistered.
	ErrClosed = errors.New("p2p: closed")
	// ErrCancelled: the call was given up (its context was cancelled, or
	// the other side cancelled its half of a transfer).
	ErrCancelled = errors.New("p2p: cancelled")
)

// ended is the sentinel of a wait that ctx, which has ended, cut short:
// ErrCancelled when it was cancelled, else ErrTimeout (its deadline
// passed: a socket's deadline, set from ctx's, may fire before ctx's own
// timer, ctx.Err still nil).
func ended(ctx context.Context) error {
	if ctx.Err() == context.Canceled {
		return ErrCancelled
	}
	return ErrTimeout
}

// OpError is what a failed call returns: the operation, the peer and the
// region it concerns (empty when none), and the cause, which wraps one of
// the sentinels.
type OpError struct {
	Op     string // the call's: "read", "write", "writeimm", "imm", "send", "recv", "connect", "deregister"...; "serve read"... for the target's side
	Peer   string
	Region string
	Err    error
}

func (e *OpError) Error() string {
	s := "p2p: " + e.Op
	if e.Peer != "" {
		s += " peer " + fmt.Sprintf("%q", e.Peer)
	}
	if e.Region != "" {
		s += " region " + e.Region
	}
	return s + ": " + e.Err.Error()
}

func (e *OpError) Unwrap() error { return e.Err }

// asOp returns err as the failure of the caller's operation op with peer:
// an *OpError of another operation (the link's own, such as "receiving",
// "watch" or "close", which fails every transfer on it) is renamed op,
// with its cause, which says what happened to the link (a connection
// closed, the peer's process exited, the endpoint closed).
func asOp(op, peer string, err error) error {
	oe, ok := err.(*OpError)
	if !ok || oe.Op == op {
		return err
	}
	if oe.Peer != "" {
		peer = oe.Peer
	}
	return &OpError{Op: op, Peer: peer, Region: oe.Region, Err: oe.Err}
}

func opErr(op, peer, region string, sentinel error, format string, args ...any) *OpError {
	return &OpError{Op: op, Peer: peer, Region: region, Err: fmt.Errorf("%w: "+format, append([]any{sentinel}, args...)...)}
}

// statusErr is the sentinel and text of a refusal by status.
func statusErr(st uint8) error {
	s := "status " + fmt.Sprint(st)
	if int(st) < len(statusText) {
		s = statusText[st]
	}
	if st == stCancelled {
		return fmt.Errorf("%w by the peer", ErrCancelled)
	}
	if st == stClosing {
		// The peer is going: as its connections' end says over TCP.
		return fmt.Errorf("%w: %s", ErrPeerLost, s)
	}
	return fmt.Errorf("%w: %s", ErrRefused, s)
}
