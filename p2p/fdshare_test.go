package p2p

import (
	"encoding/hex"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/testflood"
	"github.com/slimego/slimego/rendezvous"
)

// TestFloodLeavesHostDescriptors: an endpoint shares its process's
// descriptors with the rest of it (its links, the collectives' transport
// and shared memory). Silent connections (no secret needed) that flood
// its port must not take them all: an endpoint whose process may open
// 1024 holds at most three quarters of them in handshakes, and the
// process, flooded, still opens the sockets it needs; a member still links
// to it.
func TestFloodLeavesHostDescriptors(t *testing.T) {
	if testflood.IsChild("TestFDShareChild") {
		t.Skip("the child runs TestFDShareChild")
	}
	r := testflood.Child(t, "TestFDShareChild")
	addr := testflood.Value(t, r, "ADDR")
	info := testflood.Value(t, r, "INFO")
	defer testflood.Silent(addr, 3000)() // more than the endpoint's process may open
	time.Sleep(time.Second)              // the flood is on
	m := endpoint(t, ctxT(t, 5*time.Second), Options{Name: "m", Auth: testAuth(), Channels: 2})
	in, err := hex.DecodeString(info)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if _, err := m.ConnectInfo(ctxT(t, 20*time.Second), in); err != nil {
		t.Errorf("a member cannot link to the flooded endpoint (after %v): %v", time.Since(t0).Round(time.Millisecond), err)
	} else {
		t.Logf("a member linked to the flooded endpoint in %v", time.Since(t0).Round(time.Millisecond))
	}
	testflood.Report(t, r)
}

// TestFDShareChild is TestFloodLeavesHostDescriptors's endpoint, in a
// process that may open 1024 descriptors.
func TestFDShareChild(t *testing.T) {
	if !testflood.IsChild("TestFDShareChild") {
		t.Skip("run by TestFloodLeavesHostDescriptors")
	}
	say := testflood.Say
	if err := testflood.LimitDescriptors(1024); err != nil {
		say("FAIL setrlimit: %v", err)
		return
	}
	e, err := New(ctxT(t, 10*time.Second), Options{Name: "a", Auth: testAuth()})
	if err != nil {
		say("FAIL %v", err)
		return
	}
	defer e.Close()
	say("ADDR %s", e.Addr())
	say("INFO %s", hex.EncodeToString(e.Info()))
	time.Sleep(2 * time.Second) // the flood is on
	fails, tries, last := testflood.ListenFailures(3 * time.Second)
	say("LOG %d of %d listens of the flooded endpoint's process failed", fails, tries)
	if fails > 0 {
		say("FAIL silent connections took the endpoint's process's descriptors: %d of %d listens failed (%v)", fails, tries, last)
	}
	say("DONE")
	time.Sleep(time.Minute) // serving, until the parent ends it
}

// TestFloodOfTwoListenersLeavesDescriptors: a process that hosts the
// store and an endpoint (rank 0 of a job that uses p2p), both flooded
// with silent connections, keeps descriptors for the rest of it: the two
// listeners draw from one share (machine.TakeUnproven). Each took three
// quarters of the process's descriptors of its own, one and a half in
// all: 161 of 259 listens of the process failed (too many open files).
func TestFloodOfTwoListenersLeavesDescriptors(t *testing.T) {
	if testflood.IsChild("TestTwoFloodChild") {
		t.Skip("the child runs TestTwoFloodChild")
	}
	r := testflood.Child(t, "TestTwoFloodChild")
	ep := testflood.Value(t, r, "EP")
	st := testflood.Value(t, r, "ST")
	defer testflood.Silent(ep, 3000)()
	defer testflood.Silent(st, 3000)()
	testflood.Report(t, r)
}

// TestTwoFloodChild hosts TestFloodOfTwoListenersLeavesDescriptors's
// store and endpoint in a process that may open 1024 descriptors, and
// says how many listens of its own failed under the flood.
func TestTwoFloodChild(t *testing.T) {
	if !testflood.IsChild("TestTwoFloodChild") {
		t.Skip("run by TestFloodOfTwoListenersLeavesDescriptors")
	}
	say := testflood.Say
	if err := testflood.LimitDescriptors(1024); err != nil {
		say("FAIL setrlimit: %v", err)
		return
	}
	s, err := rendezvous.Listen("127.0.0.1:0", rendezvous.ServerConfig{Auth: testAuth()})
	if err != nil {
		say("FAIL %v", err)
		return
	}
	defer s.Close()
	e, err := New(ctxT(t, 10*time.Second), Options{Name: "a", Auth: testAuth()})
	if err != nil {
		say("FAIL %v", err)
		return
	}
	defer e.Close()
	say("EP %s", e.Addr())
	say("ST %s", s.Addr())
	time.Sleep(3 * time.Second) // the floods are on
	fails, tries, last := testflood.ListenFailures(3 * time.Second)
	say("LOG %d of %d listens failed (%v)", fails, tries, last)
	if fails > 0 {
		say("FAIL store+endpoint flood took the process's descriptors")
	}
	say("DONE")
	time.Sleep(time.Minute)
}
