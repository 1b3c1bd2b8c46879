//go:build race

package p2p

// raceEnabled: the tests are built with -race.
const raceEnabled = true
