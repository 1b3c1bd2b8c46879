package collective_test

import (
	"bytes"
	"fmt"
	"github.com/slimego/slimego/internal/machine"
	"github.com/slimego/slimego/internal/testbin"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// nodeJob is one slimerun per "node", all on this host (loopback): the
// inter-node code paths over real sockets, without namespaces.
type nodeJob struct {
	out   []string // per node
	codes []int
	runID string
}

func freePort(t *testing.T) int { return testbin.FreePort(t) }

// runNodes runs nodes × perNode ranks of prog; kill, if set, is called with
// the node's command once all have started.
func runNodes(t *testing.T, env []string, nodes, perNode int, kill func(node int, cmd *exec.Cmd), args ...string) nodeJob {
	t.Helper()
	return runNodesOn(t, placement{master: "127.0.0.1", port: freePort(t)}, env, nodes, perNode, kill, args...)
}

// placement says where each node's slimerun runs: wrap prefixes its
// command (ip netns exec), master is node 0's address.
type placement struct {
	master string
	port   int
	wrap   func(node int) []string
}

func runNodesOn(t *testing.T, pl placement, env []string, nodes, perNode int, kill func(node int, cmd *exec.Cmd), args ...string) nodeJob {
	t.Helper()
	port := strconv.Itoa(pl.port)
	runID := fmt.Sprintf("n%d-%d", os.Getpid(), time.Now().UnixNano()%1e9)
	j := nodeJob{out: make([]string, nodes), codes: make([]int, nodes), runID: runID}
	var wg sync.WaitGroup
	cmds := make([]*exec.Cmd, nodes)
	outs := make([]bytes.Buffer, nodes)
	for n := range nodes {
		full := append([]string{"--nnodes", strconv.Itoa(nodes), "--node-rank", strconv.Itoa(n), "--master-addr", pl.master,
			"--master-port", port, "--rdzv-id", runID, "--nproc-per-node", strconv.Itoa(perNode), "--monitor-interval", "15s",
			"--rdzv-timeout", "60s", filepath.Join(binDir(t), args[0])}, args[1:]...)
		argv := append([]string{filepath.Join(binDir(t), "slimerun")}, full...)
		if pl.wrap != nil {
			argv = append(pl.wrap(n), argv...)
		}
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = append(os.Environ(), env...)
		cmd.Stdout, cmd.Stderr = &outs[n], &outs[n]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[n] = cmd
	}
	if kill != nil {
		for n, cmd := range cmds {
			kill(n, cmd)
		}
	}
	for n, cmd := range cmds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				if ee, ok := err.(*exec.ExitError); ok {
					j.codes[n] = ee.ExitCode()
				}
			case <-time.After(3 * time.Minute):
				cmd.Process.Kill()
				<-done
				j.codes[n] = -1
				t.Errorf("node %d hung", n)
			}
		}()
	}
	wg.Wait()
	for n := range nodes {
		j.out[n] = outs[n].String()
	}
	entries, _ := os.ReadDir("/dev/shm")
	for _, e := range entries {
		if strings.Contains(e.Name(), runID) {
			t.Errorf("job left /dev/shm/%s", e.Name())
		}
	}
	for _, pid := range jobProcesses(runID) {
		t.Errorf("job left process %d running", pid)
	}
	return j
}

// jobProcesses lists the processes whose environment names the run: the
// workers slimerun started for it.
func jobProcesses(runID string) []int {
	var pids []int
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile("/proc/" + p.Name() + "/environ")
		if err == nil && bytes.Contains(env, []byte("\x00SLIME_RUN_ID="+runID+"\x00")) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func TestAcrossNodesLoopback(t *testing.T) {
	cases := []struct {
		nodes, perNode int
		env            []string
		sizes          string
	}{
		{2, 1, nil, "0,1,7,4096,1048579,9M"},
		{2, 2, nil, "0,1,7,4096,1048579"},
		{3, 2, nil, "0,1,7,16343,16345,1048579"},
		{2, 3, []string{"SLIME_CHANNELS=1"}, "0,5,100003"},
		{3, 2, []string{"SLIME_ALGO=ring"}, "0,1,7,4096,1048579"},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%dx%d%v", tc.nodes, tc.perNode, tc.env), func(t *testing.T) {
			j := runNodes(t, tc.env, tc.nodes, tc.perNode, nil, "agcheck", "--sizes", tc.sizes, "--iters", "2", "--plan-runs", "300")
			all := strings.Join(j.out, "")
			P := tc.nodes * tc.perNode
			if strings.Count(all, "PASS rank") != P {
				t.Fatalf("%d of %d ranks passed; exits %v\n%s", strings.Count(all, "PASS rank"), P, j.codes, all)
			}
			for n, code := range j.codes {
				if code != 0 {
					t.Errorf("node %d: slimerun exit %d", n, code)
				}
			}
		})
	}
}

// TestNodesShareMachine: two "nodes" on this one machine find that they
// share its cores (their ranks publish its boot id with their layout), so
// that where their ranks together outnumber the CPUs the node waits as an
// oversubscribed one does, though neither node's own ranks do.
func TestNodesShareMachine(t *testing.T) {
	j := runNodes(t, []string{"SLIME_DEBUG=INFO"}, 2, 2, nil, "agcheck", "--sizes", "0,7,4096", "--iters", "2")
	all := strings.Join(j.out, "")
	if strings.Count(all, "PASS rank") != 4 {
		t.Fatalf("%d of 4 ranks passed; exits %v\n%s", strings.Count(all, "PASS rank"), j.codes, all)
	}
	cpus := machine.OnlineCPUs()
	for r := range 4 {
		m := regexp.MustCompile(fmt.Sprintf(`slimego INFO rank %d/4 .* machine (\d+) ranks (\d+) cpus oversubscribed (\w+)`, r)).FindStringSubmatch(all)
		if m == nil {
			t.Fatalf("rank %d logged no layout\n%s", r, all)
		}
		if m[1] != "4" || m[2] != strconv.Itoa(cpus) {
			t.Errorf("rank %d: %s ranks on %s CPUs of its machine, want 4 on %d", r, m[1], m[2], cpus)
		}
		if 4 > cpus && m[3] != "true" {
			t.Errorf("rank %d: 4 ranks on %d CPUs not taken as oversubscribed", r, cpus)
		}
	}
}

func TestAcrossNodesMismatch(t *testing.T) {
	for _, algo := range []string{"hier", "ring"} {
		j := runNodes(t, []string{"SLIME_ALGO=" + algo}, 2, 2, nil, "agcheck", "--fault", "mismatch", "--fault-rank", "3", "--fault-size", "1M")
		all := strings.Join(j.out, "")
		for r := range 4 {
			if !regexp.MustCompile(fmt.Sprintf(`(?m)^\[%d\]: EXPECTED rank %d: allgather rank %d peer \d+: slimego: size mismatch`, r, r, r)).MatchString(all) {
				t.Errorf("%s: rank %d did not report a size mismatch\n%s", algo, r, all)
			}
		}
		if strings.Contains(all, "UNEXPECTED") {
			t.Errorf("%s:\n%s", algo, all)
		}
	}
}

// TestNodeKilled kills node 1's slimerun (and so its workers) during a
// stream of 16 MiB all-gathers: node 0's ranks must report the lost peer,
// naming it, well within the timeout, and every slimerun must fail.
func TestNodeKilled(t *testing.T) {
	start := time.Now()
	j := runNodes(t, []string{"SLIME_TIMEOUT=30"}, 2, 2, func(n int, cmd *exec.Cmd) {
		if n == 1 {
			go func() {
				time.Sleep(1500 * time.Millisecond)
				cmd.Process.Kill()
			}()
		}
	}, "agcheck", "--fault", "kill", "--fault-rank", "-1", "--fault-size", "16M")
	if d := time.Since(start); d > 25*time.Second {
		t.Errorf("took %v", d)
	}
	for r := range 2 {
		if !regexp.MustCompile(fmt.Sprintf(`(?m)^\[%d\]: EXPECTED rank %d: allgather rank %d peer \d+: slimego: (peer lost|timeout)`, r, r, r)).MatchString(j.out[0]) {
			t.Errorf("rank %d did not report the lost node\n%s", r, j.out[0])
		}
	}
	for n, code := range j.codes {
		if code == 0 {
			t.Errorf("node %d's slimerun exited 0", n)
		}
	}
}

func TestMissingNodeNamed(t *testing.T) {
	port := strconv.Itoa(freePort(t))
	cmd := exec.Command(filepath.Join(binDir(t), "slimerun"), "--nnodes", "3", "--node-rank", "0", "--master-port", port,
		"--rdzv-timeout", "1s", "--nproc-per-node", "1", filepath.Join(binDir(t), "agcheck"))
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "node rank(s) [1 2] did not join") {
		t.Fatalf("err %v\n%s", err, out)
	}
}

// startRanks starts agcheck once per entry of layout (each rank's node),
// with the environment a launcher such as srun would give: nodes of
// different sizes, no launcher store (rank 0 hosts it).
func startRanks(t *testing.T, nodeOf []int, env []string, args ...string) ([]string, []int) {
	t.Helper()
	port := strconv.Itoa(freePort(t))
	runID := fmt.Sprintf("u%d-%d", os.Getpid(), time.Now().UnixNano()%1e9)
	P := len(nodeOf)
	size := map[int]int{}
	local := make([]int, P)
	for r, n := range nodeOf {
		local[r] = size[n]
		size[n]++
	}
	outs := make([]bytes.Buffer, P)
	cmds := make([]*exec.Cmd, P)
	for r := range P {
		cmd := exec.Command(filepath.Join(binDir(t), "agcheck"), args...)
		cmd.Env = append(cleanEnv(), append([]string{
			"RANK=" + strconv.Itoa(r), "WORLD_SIZE=" + strconv.Itoa(P),
			"LOCAL_RANK=" + strconv.Itoa(local[r]), "LOCAL_WORLD_SIZE=" + strconv.Itoa(size[nodeOf[r]]),
			"GROUP_RANK=" + strconv.Itoa(nodeOf[r]), "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port,
			"SLIME_RUN_ID=" + runID, "SLIME_TIMEOUT=30"}, env...)...)
		cmd.Stdout, cmd.Stderr = &outs[r], &outs[r]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[r] = cmd
	}
	codes := make([]int, P)
	out := make([]string, P)
	for r, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			if ee, ok := err.(*exec.ExitError); ok {
				codes[r] = ee.ExitCode()
			} else {
				codes[r] = -1
			}
		}
		out[r] = outs[r].String()
	}
	return out, codes
}

// TestUnevenNodes: nodes of 2, 1 and 3 ranks (as Slurm lays out uneven task
// counts) run the ring across nodes, chosen automatically.
func TestUnevenNodes(t *testing.T) {
	out, codes := startRanks(t, []int{0, 0, 1, 2, 2, 2}, nil, "--sizes", "0,7,4096,1048579", "--iters", "1", "--plan-runs", "50")
	for r, o := range out {
		if codes[r] != 0 || !strings.Contains(o, fmt.Sprintf("PASS rank %d", r)) {
			t.Errorf("rank %d: exit %d\n%s", r, codes[r], o)
		}
	}
	// Asking for the hierarchical algorithm there is a clear error.
	out, codes = startRanks(t, []int{0, 0, 1}, []string{"SLIME_ALGO=hier"})
	for r, o := range out {
		if codes[r] == 0 || !strings.Contains(o, "needs the same number of ranks on every node") {
			t.Errorf("rank %d with SLIME_ALGO=hier: exit %d\n%s", r, codes[r], o)
		}
	}
}

// TestRestartAcrossNodes: rank 1 fails in the first attempt; both nodes'
// slimeruns restart their workers (--max-restarts 1), and the second
// attempts meet and pass.
func TestRestartAcrossNodes(t *testing.T) {
	port := strconv.Itoa(freePort(t))
	runID := fmt.Sprintf("rs%d", time.Now().UnixNano()%1e9)
	script := `if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  [ "$RANK" = 1 ] && exit 5
  export SLIME_TIMEOUT=2   # rank 0 gives up on the first attempt quickly
fi
exec "$0" --sizes 7,4096,100003 --iters 1 --plan-runs 20`
	var outs [2]bytes.Buffer
	cmds := make([]*exec.Cmd, 2)
	for n := range 2 {
		cmds[n] = exec.Command(filepath.Join(binDir(t), "slimerun"), "--nnodes", "2", "--node-rank", strconv.Itoa(n),
			"--master-port", port, "--rdzv-id", runID, "--max-restarts", "1", "sh", "-c", script, filepath.Join(binDir(t), "agcheck"))
		cmds[n].Env = append(os.Environ(), "SLIME_TIMEOUT=30")
		cmds[n].Stdout, cmds[n].Stderr = &outs[n], &outs[n]
		if err := cmds[n].Start(); err != nil {
			t.Fatal(err)
		}
	}
	for n, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Errorf("node %d: %v\n%s", n, err, outs[n].String())
		}
	}
	all := outs[0].String() + outs[1].String()
	if !strings.Contains(all, "PASS rank 0") || !strings.Contains(all, "PASS rank 1") || !strings.Contains(all, "restarting the workers") {
		t.Errorf("no passing second attempt:\n%s", all)
	}
}

// TestLinkAndTCPBenchmarks runs slimebench's link and tcp commands across
// two loopback nodes: every size's rows are there, the all-gather's bytes
// all checked right, and every figure positive. On one node, link refuses.
func TestLinkAndTCPBenchmarks(t *testing.T) {
	csvRows := func(out string) [][]string {
		var rows [][]string
		for _, l := range strings.Split(out, "\n") {
			l = strings.TrimPrefix(l, "[0]: ")
			if strings.Count(l, ",") == 9 {
				rows = append(rows, strings.Split(l, ","))
			}
		}
		return rows
	}
	j := runNodes(t, nil, 2, 1, nil, "slimebench", "link", "-b", "100003", "-e", "1M", "-f", "4", "--min-time", "20ms", "--csv", "--quiet")
	if j.codes[0] != 0 || j.codes[1] != 0 {
		t.Fatalf("link: exits %v\n%s", j.codes, strings.Join(j.out, ""))
	}
	rows := csvRows(j.out[0])
	// header, then the link, slimego and slimego/in-place for 100003, 400012
	if len(rows) != 1+3*2 || strings.Join(rows[0], ",") != "impl,backend,mode,P,nodes,S,median_us,algbw_GBps,busbw_GBps,wrong" {
		t.Fatalf("link csv:\n%s", j.out[0])
	}
	for i, r := range rows[1:] {
		impl := []string{"tcp-4-duplex-lowat4M", "slimego", "slimego/in-place"}[i%3]
		size := []string{"100003", "400012"}[i/3]
		wrong := "0" // the link's row checks nothing: its wrong is empty
		if i%3 == 0 {
			wrong = ""
		}
		if r[0] != impl || r[5] != size || r[9] != wrong || r[8] == "0.0000" {
			t.Errorf("row %v: want %s at %s bytes, wrong %q, busbw above 0", r, impl, size, wrong)
		}
	}
	j = runNodes(t, nil, 2, 1, nil, "slimebench", "tcp", "-b", "64K", "-e", "256K", "-f", "4", "--channels", "1,2", "--lowat", "0,128K", "--csv")
	if j.codes[0] != 0 || j.codes[1] != 0 {
		t.Fatalf("tcp: exits %v\n%s", j.codes, strings.Join(j.out, ""))
	}
	rows = csvRows(j.out[0])
	// latency, then {one-way, duplex} × channels {1, 2} × lowat {0, 128K} × 2 sizes
	if len(rows) != 1+1+2*2*2*2 {
		t.Fatalf("tcp csv:\n%s", j.out[0])
	}
	for _, r := range rows[1:] {
		if r[6] == "0.000" || (r[5] != "8" && r[8] == "0.0000") || r[9] != "" {
			t.Errorf("row %v: a figure is zero, or a wrong count given where nothing is checked", r)
		}
	}
	one := slimerun(t, nil, "--nproc-per-node", "2", "slimebench", "link", "--quiet")
	if one.code == 0 || !strings.Contains(one.stderr+one.out, "one rank on each of two nodes") {
		t.Errorf("link on one node: exit %d\n%s\n%s", one.code, one.out, one.stderr)
	}
}

// TestOverlapBenchAcrossNodes: across two nodes slimebench overlap cuts a
// 2 MiB block as --min-piece allows: into one piece by default (the least
// piece fills every connection, 2 MiB), into the 4 asked for with 256K.
func TestOverlapBenchAcrossNodes(t *testing.T) {
	for _, tc := range []struct {
		minPiece string
		pieces   int
	}{{"", 1}, {"256K", 4}, {"0", 4}} {
		args := []string{"slimebench", "overlap", "--m-min", "512", "--m-max", "512", "--nk", "1024", "--n", "8", "--iters", "2", "--cpu-window", "0", "--quiet"}
		if tc.minPiece != "" {
			args = append(args, "--min-piece", tc.minPiece)
		}
		j := runNodes(t, nil, 2, 1, nil, args...)
		row := regexp.MustCompile(fmt.Sprintf(`(?m)^\[0\]:\s+512\s+8\s+1024\s+float32\s+%d(\s+-?[0-9.]+){5}( \*)?$`, tc.pieces)) // *: the efficiency is mostly noise
		if j.codes[0] != 0 || j.codes[1] != 0 || !row.MatchString(j.out[0]) {
			t.Fatalf("--min-piece %q: exit %v, want %d pieces\n%s\n%s", tc.minPiece, j.codes, tc.pieces, j.out[0], j.out[1])
		}
	}
}
