//go:build race

package raceio

import (
	"runtime"
	"unsafe"
)

var token int64

// Release marks what this goroutine did so far as happening before any
// later Acquire: call it before a socket write.
func Release() { runtime.RaceReleaseMerge(unsafe.Pointer(&token)) }

// Acquire orders this goroutine after every earlier Release: call it
// after a socket read.
func Acquire() { runtime.RaceAcquire(unsafe.Pointer(&token)) }
