package collective_test

import (
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/testnetns"
)

// The tests in this file run each node in a network namespace of its own,
// joined to the others by veth pairs on a bridge, with addresses from
// 192.0.2.0/24 that exist only inside those namespaces: real network
// stacks between the nodes. They need root and iproute2 and run with
// SLIME_NETNS=1 (make test-netns).

type netnsTopo struct{ testnetns.Topo }

func (n netnsTopo) place() placement {
	return placement{master: n.Addr(0), port: 29500, wrap: n.Exec}
}

// netns builds the namespaces and removes them when the test ends, passed
// or failed.
func netns(t *testing.T, nodes int) netnsTopo {
	t.Helper()
	return netnsTopo{testnetns.Up(t, "sg", nodes)}
}

func TestNetnsAllGather(t *testing.T) {
	cases := []struct {
		nodes, perNode int
		sizes          string
	}{
		{2, 1, "1,7,4096,1048579,64M"},
		{2, 2, "1,7,4096,1048579,64M"},
		{2, 4, "1,7,4096,1048579,9437187"},
		{3, 2, "1,7,4096,1048579,9437187"},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%dx%d", tc.nodes, tc.perNode), func(t *testing.T) {
			n := netns(t, tc.nodes)
			j := runNodesOn(t, n.place(), nil, tc.nodes, tc.perNode, nil, "agcheck", "--sizes", tc.sizes, "--iters", "1", "--plan-runs", "100")
			all := strings.Join(j.out, "")
			if P := tc.nodes * tc.perNode; strings.Count(all, "PASS rank") != P {
				t.Fatalf("%d of %d ranks passed; exits %v\n%s", strings.Count(all, "PASS rank"), P, j.codes, all)
			}
		})
	}
}

// TestNetnsCUDAAcrossNodes: a GPU job (the emulated CUDA library that
// TestMain names in SLIME_CUDA_LIB, --backend cuda) of 2 nodes × 2 ranks
// in two namespaces runs PlanBuffers across them with the job's algorithm,
// hier and the ring (SLIME_ALGO), over the LL group and host-staged TCP:
// examples/allgather checks every element of three gathers with fresh
// data, in tensors of odd element counts, and says the plan ran staged.
func TestNetnsCUDAAcrossNodes(t *testing.T) {
	n := netns(t, 2)
	for _, algo := range []string{"hier", "ring"} {
		for _, shape := range [][2]string{{"517", "45"}, {"1", "3"}} {
			t.Run(algo+"/"+shape[0]+"x"+shape[1], func(t *testing.T) {
				j := runNodesOn(t, n.place(), []string{"SLIME_ALGO=" + algo, "SLIME_TIMEOUT=30", "SLIME_GPU_SCRATCH=65536"}, 2, 2, nil,
					"allgather", "--backend", "cuda", "--mode", "inter", "--m", shape[0], "--n", shape[1], "--iters", "3")
				all := strings.Join(j.out, "")
				if j.codes[0] != 0 || j.codes[1] != 0 || strings.Count(all, "all_gather check passed: 4 ranks") != 4 ||
					strings.Count(all, "across nodes: "+algo+" over host-staged tcp, staged mode") != 4 {
					t.Fatalf("exits %v\n%s", j.codes, all)
				}
			})
		}
	}
}

// netnsFault runs a stream of 16 MiB all-gathers over 2 nodes × 2 ranks
// and breaks node 1 after a while; every surviving rank must report the
// loss, naming a peer, within the timeout, and every slimerun must fail.
func netnsFault(t *testing.T, breakNode func(n netnsTopo, cmd *exec.Cmd), survivors []int) {
	n := netns(t, 2)
	start := time.Now()
	j := runNodesOn(t, n.place(), []string{"SLIME_TIMEOUT=5"}, 2, 2, func(node int, cmd *exec.Cmd) {
		if node == 1 {
			go func() {
				time.Sleep(2 * time.Second)
				breakNode(n, cmd)
			}()
		}
	}, "agcheck", "--fault", "kill", "--fault-rank", "-1", "--fault-size", "16M")
	all := strings.Join(j.out, "")
	for _, r := range survivors {
		if !regexp.MustCompile(fmt.Sprintf(`(?m)^\[%d\]: EXPECTED rank %d: \w+ rank %d peer \d+: slimego: (peer lost|timeout)`, r, r, r)).MatchString(all) {
			t.Errorf("rank %d did not report the fault naming a peer\n%s", r, all)
		}
	}
	for node, code := range j.codes {
		if code == 0 {
			t.Errorf("node %d's slimerun exited 0\n%s", node, all)
		}
	}
	if d := time.Since(start); d > 40*time.Second {
		t.Errorf("took %v with a 5 s timeout", d)
	}
}

func TestNetnsLinkDown(t *testing.T) {
	netnsFault(t, func(n netnsTopo, _ *exec.Cmd) {
		// Not n.Down: this may run off the test's goroutine, where a
		// failed ip(8) must not call t.Fatal.
		exec.Command("ip", "-n", n.NS(1), "link", "set", n.Veth(1), "down").Run()
	}, []int{0, 1, 2, 3})
}

func TestNetnsNodeKilled(t *testing.T) {
	netnsFault(t, func(_ netnsTopo, cmd *exec.Cmd) { cmd.Process.Kill() }, []int{0, 1})
}

// TestNetnsOverlap: AllGather+GEMM across two namespaces whose links tc
// limits to 1 Gbit/s (as bench-netns measures it), 2 × 2 ranks, shapes that
// are multiples of nothing, the gather in 4 pieces of under 1 MiB: every
// rank's C must match one GEMM of the whole gathered A.
func TestNetnsOverlap(t *testing.T) {
	n := netns(t, 2)
	for i := range 2 {
		if out, err := exec.Command("ip", "netns", "exec", n.NS(i), "tc", "qdisc", "replace", "dev", n.Veth(i), "root",
			"tbf", "rate", "1gbit", "burst", "256k", "latency", "20ms").CombinedOutput(); err != nil {
			t.Fatalf("tc: %v\n%s", err, out)
		}
	}
	for _, dtype := range []string{"float32", "float64"} {
		j := runNodesOn(t, n.place(), nil, 2, 2, nil, "allgather_gemm", "--m", "517", "--n", "45", "--k", "1031",
			"--dtype", dtype, "--pieces", "4", "--min-piece", "131072", "--iters", "2")
		all := strings.Join(j.out, "")
		if j.codes[0] != 0 || j.codes[1] != 0 || !strings.Contains(all, "check passed: 4 ranks") || !strings.Contains(all, "pieces=4,") {
			t.Fatalf("%s: exits %v\n%s", dtype, j.codes, all)
		}
	}
}
