// Package testnetns builds network namespaces that stand in for nodes in
// tests: node i is namespace <tag>n<i> at 192.0.2.(i+1), an address block
// that exists only inside them, its veth <tag>a<i> joined to a bridge in
// namespace <tag>sw. Real network stacks lie between the nodes, and a
// test can take a node's link down or shape it with tc. It needs root and
// iproute2; the tests that use it run with SLIME_NETNS=1 (make test-netns)
// and skip otherwise.
package testnetns

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Topo is a set of node namespaces made by Up.
type Topo struct {
	Tag string // the prefix of every name
}

// NS is node i's namespace.
func (n Topo) NS(i int) string { return fmt.Sprintf("%sn%d", n.Tag, i) }

// Veth is node i's interface, inside NS(i).
func (n Topo) Veth(i int) string { return fmt.Sprintf("%sa%d", n.Tag, i) }

// Addr is node i's address.
func (n Topo) Addr(i int) string { return fmt.Sprintf("192.0.2.%d", i+1) }

// Exec is the command prefix that runs a command in node i's namespace.
func (n Topo) Exec(i int) []string { return []string{"ip", "netns", "exec", n.NS(i)} }

// Down takes node i's link down: no FIN, no RST, silence.
func (n Topo) Down(t testing.TB, i int) { IP(t, "-n", n.NS(i), "link", "set", n.Veth(i), "down") }

// IP runs ip(8) with args and fails the test if it fails.
func IP(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// Up builds nodes namespaces named from prefix and the process id (so that
// two test binaries do not collide) and removes them when the test ends,
// passed or failed. It skips the test unless SLIME_NETNS=1.
func Up(t testing.TB, prefix string, nodes int) Topo {
	t.Helper()
	if os.Getenv("SLIME_NETNS") != "1" {
		t.Skip("needs root and iproute2: run with SLIME_NETNS=1 (make test-netns)")
	}
	n := Topo{Tag: fmt.Sprintf("%s%d", prefix, os.Getpid()%100000)}
	sw := n.Tag + "sw"
	del := func(ns string) { exec.Command("ip", "netns", "del", ns).Run() }
	IP(t, "netns", "add", sw)
	t.Cleanup(func() { del(sw) })
	IP(t, "-n", sw, "link", "add", "br0", "type", "bridge")
	IP(t, "-n", sw, "link", "set", "br0", "up")
	for i := range nodes {
		IP(t, "netns", "add", n.NS(i))
		t.Cleanup(func() { del(n.NS(i)) })
		IP(t, "-n", n.NS(i), "link", "set", "lo", "up")
		peer := fmt.Sprintf("%sb%d", n.Tag, i)
		IP(t, "link", "add", n.Veth(i), "netns", n.NS(i), "type", "veth", "peer", "name", peer, "netns", sw)
		IP(t, "-n", n.NS(i), "addr", "add", n.Addr(i)+"/24", "dev", n.Veth(i))
		IP(t, "-n", n.NS(i), "link", "set", n.Veth(i), "up")
		IP(t, "-n", sw, "link", "set", peer, "master", "br0", "up")
	}
	return n
}
