package collective_test

import (
	"bytes"
	"context"
	"fmt"
	"hash/fnv"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/internal/testbin"
)

// The tests here start agcheck's ranks directly, with the environment srun
// or mpirun gives its tasks and nothing of slimerun's: no RANK, no
// SLIME_RUN_ID, and under mpirun no MASTER_ADDR or MASTER_PORT.

// agcheckArgs keep a launcher test short: every form of the all-gather
// still runs.
var agcheckArgs = []string{"--sizes", "0,7,4096,1048579", "--iters", "1", "--plan-runs", "100"}

// launchJob starts one agcheck (bin) per environment, as a launcher would,
// and waits for every one, killing all after two minutes. It returns each
// rank's output and exit code (-1: not started, or killed). It may run in
// a goroutine of the test.
func launchJob(t *testing.T, bin string, envs [][]string) ([]string, []int) {
	outs := make([]bytes.Buffer, len(envs))
	codes := make([]int, len(envs))
	cmds := make([]*exec.Cmd, len(envs))
	for i, env := range envs {
		cmd := exec.Command(bin, agcheckArgs...)
		cmd.Env = append(cleanEnv(), env...)
		cmd.Stdout, cmd.Stderr = &outs[i], &outs[i]
		if err := cmd.Start(); err != nil {
			for _, c := range cmds[:i] {
				c.Process.Kill()
				c.Wait()
			}
			t.Errorf("starting rank %d: %v", i, err)
			for j := range codes {
				codes[j] = -1
			}
			return make([]string, len(envs)), codes
		}
		cmds[i] = cmd
	}
	deadline := time.Now().Add(2 * time.Minute)
	var wg sync.WaitGroup
	for i, cmd := range cmds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				if ee, ok := err.(*exec.ExitError); ok {
					codes[i] = ee.ExitCode()
				} else if err != nil {
					codes[i] = -1
				}
			case <-time.After(time.Until(deadline)):
				cmd.Process.Kill()
				<-done
				codes[i] = -1
				t.Errorf("process %d hung", i)
			}
		}()
	}
	wg.Wait()
	s := make([]string, len(outs))
	for i := range outs {
		s[i] = outs[i].String()
	}
	return s, codes
}

// expectPass checks that every rank passed and that the run left nothing
// in /dev/shm.
func expectPass(t *testing.T, runID string, outs []string, codes []int) {
	t.Helper()
	for i, out := range outs {
		if codes[i] != 0 || !strings.Contains(out, "PASS rank "+strconv.Itoa(i)) {
			t.Errorf("rank %d: exit %d\n%s", i, codes[i], out)
		}
	}
	entries, _ := os.ReadDir("/dev/shm")
	for _, e := range entries {
		if strings.Contains(e.Name(), "slimego-"+runID+"-") {
			t.Errorf("job left /dev/shm/%s", e.Name())
		}
	}
}

// uniqueJobID is a job number no other test run on this host uses now.
func uniqueJobID() int {
	return os.Getpid()%100000*1000 + int(time.Now().UnixNano()/1e6%1000)
}

// srunTask is the environment `srun` gives task procid of a step whose
// nodes hold counts tasks (counts as SLURM_TASKS_PER_NODE), with the
// batch script's MASTER_ADDR and MASTER_PORT exported.
func srunTask(jobID, procid int, counts []int, tasksPerNode, port string) []string {
	node, local := 0, procid
	for local >= counts[node] {
		local -= counts[node]
		node++
	}
	total := 0
	for _, c := range counts {
		total += c
	}
	nodes := strconv.Itoa(len(counts))
	return []string{
		"SLURM_JOB_ID=" + strconv.Itoa(jobID), "SLURM_JOBID=" + strconv.Itoa(jobID), "SLURM_STEP_ID=0", "SLURM_STEPID=0",
		"SLURM_JOB_NAME=agcheck", "SLURM_JOB_PARTITION=debug", "SLURM_JOB_USER=u", "SLURM_JOB_UID=1000",
		"SLURM_CLUSTER_NAME=c", "SLURM_SUBMIT_DIR=/tmp", "SLURM_SUBMIT_HOST=login1", "SLURM_PRIO_PROCESS=0",
		"SLURM_UMASK=0022", "SLURM_DISTRIBUTION=block", "SLURM_CPUS_PER_TASK=1", "SLURM_CPU_BIND=quiet,mask_cpu:0x1",
		"SLURM_LAUNCH_NODE_IPADDR=127.0.0.1", "SLURM_SRUN_COMM_HOST=127.0.0.1", "SLURM_SRUN_COMM_PORT=40211",
		"SLURM_STEP_LAUNCHER_PORT=40211", "SLURM_TOPOLOGY_ADDR_PATTERN=node", "SLURM_MPI_TYPE=none",
		"SLURM_NODELIST=n[1-" + nodes + "]", "SLURM_JOB_NODELIST=n[1-" + nodes + "]", "SLURM_STEP_NODELIST=n[1-" + nodes + "]",
		"SLURM_NTASKS=" + strconv.Itoa(total), "SLURM_NPROCS=" + strconv.Itoa(total), "SLURM_STEP_NUM_TASKS=" + strconv.Itoa(total),
		"SLURM_NNODES=" + nodes, "SLURM_JOB_NUM_NODES=" + nodes, "SLURM_STEP_NUM_NODES=" + nodes,
		"SLURM_TASKS_PER_NODE=" + tasksPerNode, "SLURM_STEP_TASKS_PER_NODE=" + tasksPerNode,
		"SLURM_JOB_CPUS_PER_NODE=" + tasksPerNode, "SLURM_CPUS_ON_NODE=" + strconv.Itoa(counts[node]),
		fmt.Sprintf("SLURMD_NODENAME=n%d", node+1), fmt.Sprintf("SLURM_TOPOLOGY_ADDR=n%d", node+1),
		"SLURM_PROCID=" + strconv.Itoa(procid), "SLURM_NODEID=" + strconv.Itoa(node), "SLURM_LOCALID=" + strconv.Itoa(local),
		"SLURM_TASK_PID=" + strconv.Itoa(30000+procid),
		"MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port,
		"SLIME_TIMEOUT=60",
	}
}

// TestSlurmLayouts runs srun-style jobs, each "node" a group of processes
// on this host: `srun -N2 -n4` (2 × 2; no SLURM_NTASKS_PER_NODE) and
// `srun -n3` over 2 nodes (2 + 1).
func TestSlurmLayouts(t *testing.T) {
	for _, tc := range []struct {
		name  string
		list  string
		nodes []int
	}{
		{"srun -N2 -n4", "2(x2)", []int{2, 2}},
		{"srun -N2 -n3", "2,1", []int{2, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			jobID := uniqueJobID()
			port := strconv.Itoa(testbin.FreePort(t))
			var envs [][]string
			for r := range tc.nodes[0] + tc.nodes[1] {
				envs = append(envs, srunTask(jobID, r, tc.nodes, tc.list, port))
			}
			outs, codes := launchJob(t, filepath.Join(binDir(t), "agcheck"), envs)
			expectPass(t, fmt.Sprintf("slurm%d.0", jobID), outs, codes)
		})
	}
}

// mpirunRank is the environment OpenMPI 4.1's `mpirun -np size` gives rank
// on one host (copied from what it prints on this machine): no
// MASTER_ADDR, no MASTER_PORT.
func mpirunRank(jobID, rank, size int, key string) []string {
	r, n, j := strconv.Itoa(rank), strconv.Itoa(size), strconv.Itoa(jobID)
	return []string{
		"OMPI_APP_CTX_NUM_PROCS=" + n, "OMPI_COMMAND=agcheck", "OMPI_FIRST_RANKS=0", "OMPI_NUM_APP_CTX=1", "OMPI_UNIVERSE_SIZE=" + n,
		"OMPI_COMM_WORLD_RANK=" + r, "OMPI_COMM_WORLD_SIZE=" + n, "OMPI_COMM_WORLD_LOCAL_RANK=" + r,
		"OMPI_COMM_WORLD_LOCAL_SIZE=" + n, "OMPI_COMM_WORLD_NODE_RANK=" + r,
		"OMPI_MCA_ess=^singleton", "OMPI_MCA_ess_base_jobid=" + j, "OMPI_MCA_ess_base_vpid=" + r,
		"OMPI_MCA_orte_ess_node_rank=" + r, "OMPI_MCA_orte_ess_num_procs=" + n, "OMPI_MCA_orte_num_nodes=1",
		"OMPI_MCA_orte_precondition_transports=" + key, "OMPI_MCA_orte_launch=1", "OMPI_MCA_orte_app_num=0",
		"OMPI_MCA_orte_hnp_uri=" + strconv.Itoa(jobID-1) + ".0;tcp://192.0.2.2:32971",
		"OMPI_MCA_pmix=^s1,s2,cray,isolated", "OMPI_MCA_shmem_RUNTIME_QUERY_hint=mmap",
		"PMIX_NAMESPACE=" + j, "PMIX_RANK=" + r, "PMIX_ID=" + j + "." + r, "PMIX_HOSTNAME=vm", "PMIX_VERSION=4.2.2rc2",
		"PMIX_SECURITY_MODE=native", "PMIX_GDS_MODULE=ds21,ds12,hash",
		"SLIME_TIMEOUT=60",
	}
}

// storePort is the port LoadEnv derives for a run id: the same
// computation, repeated so that the test states it.
func storePort(runID string) int {
	h := fnv.New32a()
	h.Write([]byte(runID))
	return 20000 + int(h.Sum32()%10000)
}

// TestConcurrentMpirunJobs runs two mpirun-style jobs of 2 ranks at once
// on this host, with OpenMPI's variables only: each finds its own store
// (a port derived from its job id) and passes; neither joins the other.
func TestConcurrentMpirunJobs(t *testing.T) {
	// Two job ids whose derived ports are free now and differ, as two
	// mpirun jobs on one host would (their job families differ).
	bin := filepath.Join(binDir(t), "agcheck")
	var ids []int
	ports := map[int]bool{}
	for id, tries := uniqueJobID()*65536+1, 0; len(ids) < 2; id, tries = id+65536, tries+1 {
		if tries == 100 {
			t.Fatalf("no free derived port in 100 job ids")
		}
		p := storePort("ompi" + strconv.Itoa(id))
		l, err := net.Listen("tcp", ":"+strconv.Itoa(p))
		if err != nil || ports[p] {
			continue
		}
		l.Close()
		ports[p] = true
		ids = append(ids, id)
	}
	keys := []string{"5c1a0d3e7b9f2461-a8e4c2b06d1f9357", "e07b3f9a1c5d8246-3b6d9f0e2a4c7185"}
	type result struct {
		outs  []string
		codes []int
	}
	results := make([]result, 2)
	var wg sync.WaitGroup
	for j := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs, codes := launchJob(t, bin, [][]string{mpirunRank(ids[j], 0, 2, keys[j]), mpirunRank(ids[j], 1, 2, keys[j])})
			results[j] = result{outs, codes}
		}()
	}
	wg.Wait()
	for j, r := range results {
		expectPass(t, "ompi"+strconv.Itoa(ids[j]), r.outs, r.codes)
	}
}

// TestRealMpirun runs agcheck under this machine's OpenMPI mpirun, two
// jobs at once, where mpirun is installed.
func TestRealMpirun(t *testing.T) {
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		t.Skip("no mpirun")
	}
	args := []string{"--oversubscribe", "-np", "2"}
	if os.Geteuid() == 0 {
		args = append(args, "--allow-run-as-root")
	}
	args = append(append(args, filepath.Join(binDir(t), "agcheck")), agcheckArgs...) // built before the goroutines
	outs := make([][]byte, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for j := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, mpirun, args...)
			cmd.Env = append(cleanEnv(), "SLIME_TIMEOUT=60")
			outs[j], errs[j] = cmd.CombinedOutput()
		}()
	}
	wg.Wait()
	for j := range 2 {
		if errs[j] != nil || strings.Count(string(outs[j]), "PASS rank") != 2 {
			t.Errorf("mpirun job %d: %v\n%s", j, errs[j], outs[j])
		}
	}
}

// TestUnevenMpirunLayout runs the job `mpirun -np 3 --host a:1,b:2` gives
// (by slot, OpenMPI's default: rank 0 alone on a, ranks 1 and 2 on b), each
// "host" a group of processes here: OpenMPI names no node, so the ranks
// must tell their nodes apart from their ranks and local ranks alone, for
// nodes of any size.
func TestUnevenMpirunLayout(t *testing.T) {
	port := strconv.Itoa(testbin.FreePort(t))
	jobID := uniqueJobID()
	key := "5c1a0d3e7b9f2461-a8e4c2b06d1f9357"
	local := []struct{ rank, size int }{{0, 1}, {0, 2}, {1, 2}}
	var envs [][]string
	for r, l := range local {
		envs = append(envs, append(mpirunRank(jobID, r, 3, key),
			"OMPI_COMM_WORLD_LOCAL_RANK="+strconv.Itoa(l.rank), "OMPI_COMM_WORLD_LOCAL_SIZE="+strconv.Itoa(l.size),
			"OMPI_COMM_WORLD_NODE_RANK="+strconv.Itoa(l.rank), "OMPI_MCA_orte_ess_node_rank="+strconv.Itoa(l.rank),
			"OMPI_MCA_orte_num_nodes=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+port))
	}
	outs, codes := launchJob(t, filepath.Join(binDir(t), "agcheck"), envs)
	expectPass(t, "ompi"+strconv.Itoa(jobID), outs, codes)
}

// TestNodeRankIsIndex: nodes labelled by their first rank, as LoadEnv
// labels them under mpirun (0 and 2 here), are numbered 0 and 1 by
// Communicator.NodeRank.
func TestNodeRankIsIndex(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := collective.RunInProcess(ctx, 2, 2, func(o *collective.Options) {
		o.NodeRank = o.Rank - o.LocalRank
		o.Timeout = 30 * time.Second
	}, func(c *collective.Communicator) error {
		if c.NodeRank() != c.Rank()/2 || c.Nodes() != 2 {
			return fmt.Errorf("rank %d: node %d of %d; want %d of 2", c.Rank(), c.NodeRank(), c.Nodes(), c.Rank()/2)
		}
		return nil
	})
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}
