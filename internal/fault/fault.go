// Package fault holds the error values that every layer of slimego returns,
// so that a caller can test any error with errors.Is against the sentinels
// that package collective re-exports.
package fault

import (
	"errors"
	"fmt"
)

var (
	// ErrTimeout: a peer did not do its part before the deadline.
	ErrTimeout = errors.New("slimego: timeout")
	// ErrPeerLost: a peer's process exited, or it closed or abandoned the
	// communicator, during an operation.
	ErrPeerLost = errors.New("slimego: peer lost")
	// ErrSizeMismatch: ranks called the same operation with sizes (or
	// operations) that do not agree.
	ErrSizeMismatch = errors.New("slimego: size mismatch")
	// ErrClosed: the communicator was closed, or broken by an earlier error.
	ErrClosed = errors.New("slimego: communicator closed")
	// ErrInvalid: an argument is wrong on this rank alone (a destination too
	// small, overlapping buffers, a bad environment).
	ErrInvalid = errors.New("slimego: invalid argument")
)

// OpError is the error every collective operation returns: which operation,
// on which rank, and which peer it concerns (-1 when none).
type OpError struct {
	Op     string
	Rank   int
	Peer   int
	Err    error  // one of the sentinels above, or a wrapped cause
	Detail string // what was observed, for people
}

func (e *OpError) Error() string {
	s := fmt.Sprintf("%s rank %d", e.Op, e.Rank)
	if e.Peer >= 0 {
		s += fmt.Sprintf(" peer %d", e.Peer)
	}
	s += ": " + e.Err.Error()
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

func (e *OpError) Unwrap() error { return e.Err }

// New returns an *OpError.
func New(op string, rank, peer int, err error, format string, args ...any) *OpError {
	return &OpError{Op: op, Rank: rank, Peer: peer, Err: err, Detail: fmt.Sprintf(format, args...)}
}
