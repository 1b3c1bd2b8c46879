package main

import (
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/testnetns"
)

// TestNetnsKVCache runs the example across two nodes, each a network
// namespace of its own (internal/testnetns) with one slimerun: 2 prefill
// ranks on node 0 write into the caches of 2 decode ranks on node 1. Over
// TCP (--tcp-only) the pages cross the veth link; without it p2p finds
// that the two namespaces share a kernel (boot id and pid namespace) and
// copies on the host (cma), as it would between two containers of one
// machine. It runs with SLIME_NETNS=1 (make test-netns).
func TestNetnsKVCache(t *testing.T) {
	n := testnetns.Up(t, "kv", 2)
	dir := build(t)
	for i, tc := range []struct {
		name, transport string
		args            []string
	}{
		{"tcp", "[tcp]", []string{"--tcp-only", "--pages", "700", "--page-size", "5000", "--batch", "32"}},
		{"same kernel", "[cma]", []string{"--pages", "512", "--page-size", "16K", "--batch", "64"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outs, failed := nodes(t, dir, n.Exec, n.Addr(0), 29600+i, 2*time.Minute, tc.args...)
			out := outs[0] + outs[1]
			if len(failed) > 0 || strings.Count(out, "PASS rank") != 4 || strings.Count(out, "(prefill)") != 2 ||
				strings.Count(out, "over "+tc.transport) != 2 || strings.Contains(out, " 0 pages") {
				t.Fatalf("failed %v:\n%s", failed, out)
			}
		})
	}
}
