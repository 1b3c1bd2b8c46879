package launcher

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/testbin"
	"github.com/slimego/slimego/rendezvous"
)

// testStore hosts a store with the job's secret and run id, as node 0's
// launcher does, and a client of it.
func testStore(t *testing.T, run, secret string) (*rendezvous.Server, *rendezvous.Client, int) {
	t.Helper()
	auth := rendezvous.Auth{Secret: []byte(secret), Job: run}
	srv, err := rendezvous.Listen("127.0.0.1:0", rendezvous.ServerConfig{Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := rendezvous.Dial(ctx, net.JoinHostPort("127.0.0.1", strconv.Itoa(srv.Port())), auth)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return srv, cl, srv.Port()
}

// TestBlamesChecked: the ranks workers blame are read from the store, and
// nothing read there is trusted: a rank outside [0, world) or a value that
// is not a number is dropped; rank 0 is a rank.
func TestBlamesChecked(t *testing.T) {
	const run, secret = "blames", "s"
	srv, cl, _ := testStore(t, run, secret)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for r, v := range map[int]string{0: "3", 1: "0", 2: "4", 3: "-1"} {
		if err := cl.Set(ctx, BlameKey(run, 0, r), []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	cl.Set(ctx, BlameKey(run, 1, 0), []byte("x1"))
	cfg := &Config{NNodes: 1, NProcPerNode: 4, RunID: run}
	for _, j := range []*job{{cfg: cfg, srv: srv}, {cfg: cfg, client: cl}} {
		got := j.blames(0)
		if len(got) != 2 || got[0] != 3 || got[1] != 0 {
			t.Errorf("server %v: blames = %v, want map[0:3 1:0] (4 and -1 are not ranks of 4)", j.srv != nil, got)
		}
		if got := j.blames(1); len(got) != 0 {
			t.Errorf("server %v: attempt 1 blames = %v, want none", j.srv != nil, got)
		}
	}
}

// TestSummaryNamesNode: a blamed rank that is not this node's is placed on
// its node.
func TestSummaryNamesNode(t *testing.T) {
	j := &job{cfg: &Config{NNodes: 3, NProcPerNode: 2}}
	if got := j.summarize(3, nil, nil); got != "rank 3 is on node 1" {
		t.Errorf("summary %q, want %q", got, "rank 3 is on node 1")
	}
}

// TestMasterPortChecked: a node other than 0 reads the workers'
// MASTER_PORT from node 0's store and refuses what is not a port.
func TestMasterPortChecked(t *testing.T) {
	for _, tc := range []struct {
		value string
		port  bool
	}{{"0", false}, {"1", true}, {"65535", true}, {"65536", false}, {"http", false}} {
		run := "mport" + strconv.Itoa(testbin.FreePort(t))
		_, cl, port := testStore(t, run, "s")
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := cl.Set(ctx, PortKey(run), []byte(tc.value)); err != nil {
			t.Fatal(err)
		}
		err := Run(ctx, Config{NNodes: 2, NodeRank: 1, NProcPerNode: 1, MasterAddr: "127.0.0.1", MasterPort: port,
			RunID: run, JobSecret: []byte("s"), RdzvTimeout: time.Second, Program: "true"})
		cancel()
		refused := err != nil && strings.Contains(err.Error(), "not a port")
		if err == nil || refused == tc.port {
			t.Errorf("MASTER_PORT %q: err = %v; want it refused as not a port: %v", tc.value, err, !tc.port)
		}
	}
}
