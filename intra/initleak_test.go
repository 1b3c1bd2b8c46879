package intra

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/teststore"
	"github.com/slimego/slimego/rendezvous"
)

// TestFailedInitLeavesNoSegment: local rank 0's Init fails because its
// peer never comes. Rank 0's process lives on (it reports the error, or
// tries again), so no sweep removes what it created: its failed Init must
// remove the segment's name itself.
func TestFailedInitLeavesNoSegment(t *testing.T) {
	addr := teststore.Serve(t, rendezvous.ServerConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := rendezvous.Dial(ctx, addr, rendezvous.Auth{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	prefix := "slimego-initleak" + strconv.Itoa(os.Getpid()) + "-"
	left := func() []string {
		ents, _ := os.ReadDir("/dev/shm")
		var names []string
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), prefix) {
				names = append(names, e.Name())
			}
		}
		return names
	}
	defer func() {
		for _, n := range left() {
			os.Remove("/dev/shm/" + n)
		}
	}()
	for try := range 2 {
		tctx, tcancel := context.WithTimeout(ctx, 500*time.Millisecond)
		_, err := New(tctx, Config{Store: st, Key: "initleak/" + strconv.Itoa(try), ShmPrefix: prefix, Rank: 0, Size: 2, Timeout: 300 * time.Millisecond})
		tcancel()
		if err == nil {
			t.Fatal("Init of a group whose peer never comes succeeded")
		}
	}
	if names := left(); len(names) > 0 {
		t.Fatalf("2 failed Inits left %d segments in /dev/shm: %v", len(names), names)
	}
}
