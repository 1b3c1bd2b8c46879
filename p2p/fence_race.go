//go:build race

package p2p

import "sync"

// The race detector cannot see the order a socket imposes between two
// endpoints of one process (a target's write to its region, then the
// answer that completes the initiator's Wait). Under -race a mutex adds
// that edge: every frame queued releases, every frame received acquires.
var fence sync.Mutex

func fenceRelease() { fence.Lock(); fence.Unlock() }
func fenceAcquire() { fence.Lock(); fence.Unlock() }
