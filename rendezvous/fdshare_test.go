package rendezvous

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/testflood"
)

// The store's tests under a flood of silent connections, or many members,
// each with its store in a child process whose descriptors are limited
// (testflood.Child).

// floodAuth is the job of these tests' stores.
var floodAuth = Auth{Secret: []byte("s3cret"), Job: "job"}

// serveLimited is a child's store: it limits the process to n
// descriptors, listens, hands the parent its address ("ADDR"), and
// returns the store, or nil having said why ("FAIL").
func serveLimited(n uint64) *Server {
	say := testflood.Say
	if err := testflood.LimitDescriptors(n); err != nil {
		say("FAIL setrlimit: %v", err)
		return nil
	}
	s, err := Listen("127.0.0.1:0", ServerConfig{Auth: floodAuth})
	if err != nil {
		say("FAIL %v", err)
		return nil
	}
	say("ADDR %s", s.Addr())
	return s
}

// TestFloodLeavesHostDescriptors: a store shares its process's
// descriptors with the rest of it (rank 0's transport, its shared memory,
// slimerun's workers' pipes). Silent connections (no secret needed) that
// flood it must not take them all: a store whose process may open 1024
// holds at most three quarters of them, and the process, flooded, still
// opens the sockets it needs; a member still joins.
func TestFloodLeavesHostDescriptors(t *testing.T) {
	if testflood.IsChild("TestFDShareChild") {
		t.Skip("the child runs TestFDShareChild")
	}
	r := testflood.Child(t, "TestFDShareChild")
	addr := testflood.Value(t, r, "ADDR")
	defer testflood.Silent(addr, 3000)() // more than the store's process may open
	testflood.Report(t, r)
}

// TestFDShareChild is TestFloodLeavesHostDescriptors's store, in a process
// that may open 1024 descriptors.
func TestFDShareChild(t *testing.T) {
	if !testflood.IsChild("TestFDShareChild") {
		t.Skip("run by TestFloodLeavesHostDescriptors")
	}
	say := testflood.Say
	s := serveLimited(1024)
	if s == nil {
		return
	}
	defer s.Close()
	time.Sleep(2 * time.Second) // the flood is on
	fails, tries, last := testflood.ListenFailures(3 * time.Second)
	s.mu.Lock()
	held := len(s.conns)
	s.mu.Unlock()
	say("LOG the store held %d connections; %d of %d listens of its process failed", held, fails, tries)
	if fails > 0 {
		say("FAIL silent connections took the store's process's descriptors: %d of %d listens failed (%v)", fails, tries, last)
	}
	cl, err := Dial(ctxT(t, 10*time.Second), s.Addr().String(), floodAuth)
	if err != nil {
		say("FAIL a member cannot join the flooded store: %v", err)
		return
	}
	cl.Close()
	say("DONE")
}

// TestFloodAtDescriptorLimit: a store whose process has fewer descriptors
// than MaxConns (a host's `ulimit -n`), flooded without end by silent
// connections (no secret needed), still lets a member in: out of
// descriptors, it closes the oldest silent connection, as it does at
// MaxConns.
func TestFloodAtDescriptorLimit(t *testing.T) {
	if testflood.IsChild("TestEMFILEChild") {
		t.Skip("the child runs TestEMFILEChild")
	}
	r := testflood.Child(t, "TestEMFILEChild")
	addr := testflood.Value(t, r, "ADDR")
	// The flood: always more silent connections than the store's descriptors.
	defer testflood.Silent(addr, 2000)()
	time.Sleep(time.Second)
	cl, err := Dial(ctxT(t, 10*time.Second), addr, floodAuth)
	if err != nil {
		t.Fatalf("a member cannot reach a store flooded to its descriptor limit: %v", err)
	}
	cl.Close()
}

// TestEMFILEChild is TestFloodAtDescriptorLimit's store: 256 descriptors.
func TestEMFILEChild(t *testing.T) {
	if !testflood.IsChild("TestEMFILEChild") {
		t.Skip("run by TestFloodAtDescriptorLimit")
	}
	if s := serveLimited(256); s != nil {
		defer s.Close()
		time.Sleep(30 * time.Second) // serving, until the parent ends it
	}
}

// TestMembersBeyondDescriptorShare: members that have proven themselves do
// not count against the share of descriptors kept for connections from
// anyone (three quarters of the process's): a store whose process may
// open 1024 descriptors serves 850 members. Counting every connection,
// it took 768 and left the others to time out, with no word why.
func TestMembersBeyondDescriptorShare(t *testing.T) {
	if testflood.IsChild("TestMembersShareChild") {
		t.Skip("the child runs TestMembersShareChild")
	}
	r := testflood.Child(t, "TestMembersShareChild")
	addr := testflood.Value(t, r, "ADDR")
	const members = 850
	var wg sync.WaitGroup
	var mu sync.Mutex
	var cls []*Client
	var failed []error
	sem := make(chan struct{}, 64) // dial in waves: a member waits for the store, not for the processors
	for range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cl, err := Dial(ctx, addr, floodAuth)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed = append(failed, err)
				return
			}
			cls = append(cls, cl)
		}()
	}
	wg.Wait()
	for _, c := range cls {
		c.Close()
	}
	if len(failed) > 0 {
		t.Fatalf("%d of %d members got in; %d failed, the first: %v", len(cls), members, len(failed), failed[0])
	}
}

// TestMembersShareChild hosts the store of TestMembersBeyondDescriptorShare
// in a process that may open 1024 descriptors.
func TestMembersShareChild(t *testing.T) {
	if !testflood.IsChild("TestMembersShareChild") {
		t.Skip("run by TestMembersBeyondDescriptorShare")
	}
	if s := serveLimited(1024); s != nil {
		defer s.Close()
		time.Sleep(2 * time.Minute) // serving, until the parent ends it
	}
}
