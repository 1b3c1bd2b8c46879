// Package raceio tells the race detector that bytes written to a socket
// happen before the reads that see them, where the runtime's own
// bookkeeping does not.
//
// The standard library's net.Conn marks each Write as a release and each
// Read as an acquire of one token private to internal/poll, so that a
// goroutine that answers what another wrote is ordered after it. Writes
// and reads made on the file descriptor directly (raw system calls in the
// hot paths of inter and p2p, golang.org/x/sys/unix's own token) are
// outside that order: a peer that reads a region, writes it to a socket
// and lets the other side write the same region again would be reported
// as a race the kernel's socket already orders. Every socket write of
// payload in those packages calls Release first and every read calls
// Acquire after, on this package's token, whatever path carried it.
//
// Without the race build tag both are empty and inline away.
package raceio
