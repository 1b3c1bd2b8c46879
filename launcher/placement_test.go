package launcher

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/machine"
	"github.com/slimego/slimego/internal/testbin"
)

func TestParsePlacement(t *testing.T) {
	id := "0123abcd-0123-4567-89ab-cdef01234567"
	for _, tc := range []struct {
		in, host, cpus string
		ok             bool
	}{
		{id + " 0,1", id, "0,1", true},
		{id + " -", id, "-", true},
		{"- 3", "-", "3", true},
		{id + " 0,,1", "", "", false},
		{id + " 0,1,", "", "", false},
		{id + " 0-1", "", "", false},
		{id + " 12345678", "", "", false},
		{id + "  0", "", "", false},
		{id + " 0 1", "", "", false},
		{id, "", "", false},
		{"", "", "", false},
		{"ABCD 0", "", "", false},
		{"../x 0", "", "", false},
		{strings.Repeat("a", 65) + " 0", "", "", false},
		{strings.Repeat("a", 64) + " 0", strings.Repeat("a", 64), "0", true},
		{"- " + strings.Repeat("1,", maxPlacement/2), "", "", false},
		{"- " + strings.Repeat("1,", (maxPlacement-4)/2) + "11", "-", strings.Repeat("1,", (maxPlacement-4)/2) + "11", true},
		{"- " + strings.Repeat("1,", (maxPlacement-4)/2) + "111", "", "", false},
		{"- 1234567", "-", "1234567", true},
		{"- 9,09,90", "-", "9,09,90", true},
		{"09af- 0", "09af-", "0", true},
		{"g 0", "", "", false},
		{"/ 0", "", "", false},
		{": 0", "", "", false},
		{"` 0", "", "", false},
		{"- a", "", "", false},
		{"- /", "", "", false},
		{"- :", "", "", false},
		{"- ,", "", "", false},
	} {
		host, cpus, err := parsePlacement([]byte(tc.in))
		if (err == nil) != tc.ok || host != tc.host || cpus != tc.cpus {
			t.Errorf("parsePlacement(%.40q) = %q, %q, %v; want %q, %q, ok %v", tc.in, host, cpus, err, tc.host, tc.cpus, tc.ok)
		}
	}
	if h, c, err := parsePlacement([]byte(placement([]int{0, 2, 5}))); err != nil || c != "0,2,5" || (h != "-" && len(h) != 36) {
		t.Errorf("this node's own placement reads back as %q, %q, %v", h, c, err)
	}
	if _, c, err := parsePlacement([]byte(placement(nil))); err != nil || c != "-" {
		t.Errorf("a placement without CPUs reads back as %q, %v", c, err)
	}
	for _, tc := range []struct {
		a, b [2]string
		want bool
	}{
		{[2]string{id, "0,1"}, [2]string{id, "0,1"}, true},
		{[2]string{id, "0,1"}, [2]string{id, "1"}, false},
		{[2]string{id, "0,1"}, [2]string{"ab", "0,1"}, false},
		{[2]string{"-", "0,1"}, [2]string{"-", "0,1"}, false},
		{[2]string{id, "-"}, [2]string{id, "-"}, false},
	} {
		if got := sharesCPUs(tc.a[0], tc.a[1], tc.b[0], tc.b[1]); got != tc.want {
			t.Errorf("sharesCPUs(%v, %v) = %v", tc.a, tc.b, got)
		}
	}
}

// TestCPUOf: ranks are dealt the CPUs round, starting base ranks in.
func TestCPUOf(t *testing.T) {
	c := Config{cpus: []int{10, 11, 12}}
	for _, tc := range []struct{ base, local, want int }{
		{0, 0, 10}, {0, 2, 12}, {0, 3, 10}, {3, 1, 11}, {1, 0, 11}, {2, 2, 11}, {4, 0, 11},
	} {
		if got := c.cpuOf(tc.base, tc.local); got != tc.want {
			t.Errorf("cpuOf(%d, %d) = %d, want %d", tc.base, tc.local, got, tc.want)
		}
	}
}

func FuzzParsePlacement(f *testing.F) {
	f.Add([]byte("0123abcd-0123-4567-89ab-cdef01234567 0,1"))
	f.Add([]byte("- -"))
	f.Fuzz(func(t *testing.T, b []byte) {
		host, cpus, err := parsePlacement(b)
		if err != nil {
			return
		}
		if host+" "+cpus != string(b) || !machine.ValidID(host) || !validCPUList(cpus) {
			t.Fatalf("%q accepted as %q, %q", b, host, cpus)
		}
		for part := range strings.SplitSeq(cpus, ",") {
			if _, err := strconv.Atoi(part); err != nil && cpus != "-" {
				t.Fatalf("%q accepted with CPU %q", b, part)
			}
		}
	})
}

// TestBindAcrossNodesOnOneMachine: two nodes of one job on one machine,
// each with BindToCore, deal the machine's CPUs between them: node 1's
// ranks start after node 0's instead of on the same CPUs.
func TestBindAcrossNodesOnOneMachine(t *testing.T) {
	cpus, err := allowedCPUs()
	if err != nil {
		t.Fatal(err)
	}
	if len(cpus) < 2 {
		t.Skip("one CPU: nothing to deal")
	}
	for _, nproc := range []int{1, 2} {
		port := testbin.FreePort(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		var outs, logs [2]syncBuffer
		errs := make(chan error, 2)
		for node := range 2 {
			go func() {
				errs <- Run(ctx, Config{NNodes: 2, NodeRank: node, NProcPerNode: nproc, MasterAddr: "127.0.0.1", MasterPort: port,
					RdzvTimeout: 30 * time.Second, BindToCore: true, JobSecret: []byte("s"),
					Env: []string{"PATH=" + os.Getenv("PATH")}, Program: "sh",
					Args:   []string{"-c", `echo "C=$(grep Cpus_allowed_list /proc/self/status | cut -f2)"`},
					Stdout: &outs[node], Stderr: &outs[node],
					Logf: func(f string, a ...any) { fmt.Fprintf(&logs[node], f+"\n", a...) }})
			}()
		}
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		cancel()
		// Node 1 says where its ranks start; node 0, which starts at the
		// first CPU, says nothing of it.
		shares := func(node int) bool { return strings.Contains(logs[node].String(), "shares its machine's CPUs") }
		if want := fmt.Sprintf("shares its machine's CPUs with %d rank(s) of earlier nodes", nproc); !strings.Contains(logs[1].String(), want) || shares(0) {
			t.Errorf("%d per node: node 1 logged %q, node 0 %q; want node 1 alone to log %q", nproc, logs[1].String(), logs[0].String(), want)
		}
		for node := range 2 {
			for local := range nproc {
				rank := node*nproc + local
				if want := "[" + strconv.Itoa(rank) + "]: C=" + strconv.Itoa(cpus[rank%len(cpus)]) + "\n"; !strings.Contains(outs[node].String(), want) {
					t.Errorf("%d per node: node %d: want %q in\n%s", nproc, node, want, outs[node].String())
				}
			}
		}
	}
}
