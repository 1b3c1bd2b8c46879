package collective

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/device"
)

func TestLoadEnv(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		want Options
	}{
		{"nothing: a world of one", map[string]string{},
			Options{Job: Job{Rank: 0, WorldSize: 1, LocalWorldSize: 1, MasterPort: 29500, RunID: "port29500"}}},
		{"rank 0 alone: a world of one", map[string]string{"SLURM_PROCID": "0"},
			Options{Job: Job{Rank: 0, WorldSize: 1, LocalWorldSize: 1, MasterPort: 29500, RunID: "port29500"}}},
		{"torchrun", map[string]string{"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
			"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234", "TORCHELASTIC_RUN_ID": "job", "TORCHELASTIC_USE_AGENT_STORE": "True"},
			Options{Job: Job{Rank: 5, WorldSize: 8, LocalRank: 1, LocalWorldSize: 4, NodeRank: 1, MasterAddr: "10.0.0.1", MasterPort: 1235, RunID: "job"}}},
		{"slimerun", map[string]string{"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "0",
			"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29600", "SLIME_AGENT_STORE": "1", "SLIME_RUN_ID": "abc", "SLIME_RESTART_COUNT": "2",
			"SLIME_TIMEOUT": "90s", "SLIME_BACKEND": "cpu", "SLIME_SLOT_BYTES": "128K"},
			Options{Job: Job{Rank: 2, WorldSize: 4, LocalRank: 2, LocalWorldSize: 4, MasterAddr: "127.0.0.1", MasterPort: 29600, AgentStore: true, RunID: "abc", Attempt: 2}, Shm: Shm{SlotBytes: 128 << 10}, Timeout: 90 * time.Second, Backend: device.CPU}},
		{"openmpi", map[string]string{"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
			"OMPI_COMM_WORLD_LOCAL_SIZE": "2", "MASTER_ADDR": "h0", "SLIME_TIMEOUT": "2.5"},
			Options{Job: Job{Rank: 3, WorldSize: 4, LocalRank: 1, LocalWorldSize: 2, NodeRank: 2, MasterAddr: "h0", MasterPort: 29500, RunID: "port29500"}, Timeout: 2500 * time.Millisecond}}, // the node: its first rank
		{"knobs", map[string]string{"SLIME_RCVLOWAT": "1M", "SLIME_EAGER": "1", "SLIME_GPU_SCRATCH": "4M", "SLIME_GPU_BLOCKS": "64", "SLIME_CHANNELS": "4"},
			Options{Job: Job{WorldSize: 1, LocalWorldSize: 1, MasterPort: 29500, RunID: "port29500"}, TCP: TCP{RcvLowat: 1 << 20, Channels: 4}, CUDA: CUDA{Eager: true, GPUScratch: 4 << 20, GPUBlocks: 64}}},
		{"lowat off", map[string]string{"SLIME_RCVLOWAT": "off"},
			Options{Job: Job{WorldSize: 1, LocalWorldSize: 1, MasterPort: 29500, RunID: "port29500"}, TCP: TCP{RcvLowat: -1}}},
		{"send copy", map[string]string{"SLIME_SEND_COPY_MIN": "48M"},
			Options{Job: Job{WorldSize: 1, LocalWorldSize: 1, MasterPort: 29500, RunID: "port29500"}, TCP: TCP{SendCopyMin: 48 << 20}}},
		{"send copy off", map[string]string{"SLIME_SEND_COPY_MIN": "-1"},
			Options{Job: Job{WorldSize: 1, LocalWorldSize: 1, MasterPort: 29500, RunID: "port29500"}, TCP: TCP{SendCopyMin: -1}}},
		{"slurm", map[string]string{"SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_LOCALID": "2", "SLURM_NTASKS_PER_NODE": "4", "SLURM_NODEID": "1", "MASTER_ADDR": "n1"},
			Options{Job: Job{Rank: 6, WorldSize: 8, LocalRank: 2, LocalWorldSize: 4, NodeRank: 1, MasterAddr: "n1", MasterPort: 29500, RunID: "port29500"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := LoadEnv(func(k string) string { return tc.env[k] })
			if err != nil {
				t.Fatal(err)
			}
			if tc.want.JobID == "" {
				tc.want.JobID = tc.want.RunID // the launcher's job: its run id
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestLoadEnvErrors(t *testing.T) {
	cases := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"RANK": "4", "WORLD_SIZE": "4", "MASTER_ADDR": "x"}, "RANK=4 is not below WORLD_SIZE=4"},
		{map[string]string{"RANK": "1", "WORLD_SIZE": "2"}, "MASTER_ADDR is not set"},
		{map[string]string{"RANK": "x", "WORLD_SIZE": "2"}, `RANK="x" is not a non-negative integer`},
		{map[string]string{"WORLD_SIZE": "2", "MASTER_ADDR": "x"}, "no rank variable"},
		// A rank other than 0 without a world size cannot be a world of
		// one: it ran as rank 0 of 1, unchecked.
		{map[string]string{"RANK": "1", "MASTER_ADDR": "x"}, "RANK=1 is set but no world size variable (WORLD_SIZE, OMPI_COMM_WORLD_SIZE, SLURM_NTASKS, PMI_SIZE)"},
		{map[string]string{"OMPI_COMM_WORLD_RANK": "3"}, "OMPI_COMM_WORLD_RANK=3 is set but no world size variable"},
		{map[string]string{"SLURM_PROCID": "2"}, "SLURM_PROCID=2 is set but no world size variable"},
		{map[string]string{"RANK": "0", "WORLD_SIZE": "6", "LOCAL_RANK": "4", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "x"}, "local rank 4 of local world size 4"},
		{map[string]string{"SLIME_ALGO": "tree"}, "SLIME_ALGO"},
		{map[string]string{"MASTER_PORT": "70000"}, "not a TCP port"},
		{map[string]string{"SLIME_TIMEOUT": "-3s"}, "SLIME_TIMEOUT"},
		{map[string]string{"SLIME_BACKEND": "tpu"}, "unknown backend"},
		{map[string]string{"SLIME_SLOT_BYTES": "lots"}, "SLIME_SLOT_BYTES"},
		// Zero was taken for the default without a word.
		{map[string]string{"SLIME_SLOTS": "0"}, `SLIME_SLOTS="0": want 1 or more (leave it unset for the default)`},
		{map[string]string{"SLIME_SLOT_BYTES": "0"}, `SLIME_SLOT_BYTES="0": want 1 or more`},
		{map[string]string{"SLIME_RCVLOWAT": "big"}, "SLIME_RCVLOWAT"},
		{map[string]string{"SLIME_EAGER": "maybe"}, "SLIME_EAGER"},
		{map[string]string{"SLIME_GPU_SCRATCH": "0"}, "SLIME_GPU_SCRATCH"},
		{map[string]string{"SLIME_GPU_BLOCKS": "0"}, `SLIME_GPU_BLOCKS="0": want 1 to 256`},
		{map[string]string{"SLIME_GPU_BLOCKS": "257"}, `SLIME_GPU_BLOCKS="257"`},
		{map[string]string{"SLIME_GPU_BLOCKS": "many"}, `SLIME_GPU_BLOCKS="many"`},
		// A timeout of none, in either form, is refused by name.
		{map[string]string{"SLIME_TIMEOUT": "-1"}, `SLIME_TIMEOUT="-1": not positive`},
		{map[string]string{"SLIME_TIMEOUT": "0"}, `SLIME_TIMEOUT="0": not positive`},
		{map[string]string{"SLIME_TIMEOUT": "-5s"}, `SLIME_TIMEOUT="-5s": not positive`},
		{map[string]string{"SLIME_TIMEOUT": "0s"}, `SLIME_TIMEOUT="0s": not positive`},
		{map[string]string{"SLIME_TIMEOUT": "NaN"}, `SLIME_TIMEOUT="NaN"`},
		{map[string]string{"SLIME_TIMEOUT": "1e300"}, `SLIME_TIMEOUT="1e300": too long`},
		{map[string]string{"SLIME_SPIN": "-1"}, `SLIME_SPIN="-1": not positive`},
		{map[string]string{"SLIME_SPIN": "-2ms"}, `SLIME_SPIN="-2ms": not positive`},
	}
	for _, tc := range cases {
		_, err := LoadEnv(func(k string) string { return tc.env[k] })
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v; want ErrInvalid containing %q", tc.env, err, tc.want)
		}
	}
}

func TestBuildLayout(t *testing.T) {
	type w struct{ node, local, size int }
	cases := []struct {
		name    string
		ranks   []w
		nodes   []int // ranks per node
		uniform bool
		err     string
	}{
		{"one node", []w{{0, 0, 3}, {0, 1, 3}, {0, 2, 3}}, []int{3}, true, ""},
		{"2x2", []w{{0, 0, 2}, {0, 1, 2}, {1, 0, 2}, {1, 1, 2}}, []int{2, 2}, true, ""},
		{"uneven", []w{{0, 0, 2}, {0, 1, 2}, {1, 0, 1}}, []int{2, 1}, false, ""},
		{"interleaved", []w{{0, 0, 2}, {1, 0, 2}, {0, 1, 2}, {1, 1, 2}}, []int{2, 2}, false, ""},
		{"sparse node ids", []w{{7, 0, 1}, {3, 0, 1}}, []int{1, 1}, false, ""},
		{"duplicate local rank", []w{{0, 0, 2}, {0, 0, 2}}, nil, false, "local rank 0 of 2"},
		{"wrong local size", []w{{0, 0, 3}, {0, 1, 3}}, nil, false, "node 0 has 2 ranks"},
		// Where the launcher names the node (torchrun, srun), no word of
		// mpirun.
		{"wrong local size, a named node", []w{{5, 0, 3}, {5, 1, 3}}, nil, false, "node 5 has 2 ranks, but rank 0 says it is local rank 0 of 3\x00"},
		// mpirun -np 4 --map-by node on two hosts, nodes labelled as under
		// mpirun (rank − local rank: 0, 1, 1, 2): refused, saying how to
		// map instead.
		{"mpirun --map-by node", []w{{0, 0, 2}, {1, 0, 2}, {1, 1, 2}, {2, 1, 2}}, nil, false, "has 1 ranks, but rank 0 says it is local rank 0 of 2 (under mpirun, whose ranks name no node, a node's ranks must come one after another: its default mapping by slot, not --map-by node)"},
	}
	for _, tc := range cases {
		at := func(r int) (int, int, int) { return tc.ranks[r].node, tc.ranks[r].local, tc.ranks[r].size }
		lay, err := buildLayout(0, at, len(tc.ranks))
		if tc.err != "" {
			// A trailing NUL: the message ends there (no mpirun hint
			// where the nodes are named).
			want, end := strings.CutSuffix(tc.err, "\x00")
			if err == nil || !strings.Contains(err.Error(), want) || end && !strings.HasSuffix(err.Error(), want) {
				t.Errorf("%s: err = %v, want %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if got := nodeSizes(lay); fmt.Sprint(got) != fmt.Sprint(tc.nodes) || lay.uniform != tc.uniform {
			t.Errorf("%s: nodes %v uniform %v; want %v, %v", tc.name, got, lay.uniform, tc.nodes, tc.uniform)
		}
		for _, m := range lay.members {
			for local, r := range m {
				if tc.ranks[r].local != local {
					t.Errorf("%s: members %v out of local order", tc.name, lay.members)
				}
			}
		}
	}
}

// srun returns the environment that `srun` gives task procid of a step,
// as Slurm sets it (the launcher's noise included): job holds the step's
// variables, node the task's node index, local its local id, host the
// node's name.
func srun(job map[string]string, procid, node, local int, host string) map[string]string {
	env := map[string]string{
		"SLURM_JOB_ID": "4242", "SLURM_JOBID": "4242", "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
		"SLURM_JOB_NAME": "train", "SLURM_JOB_PARTITION": "debug", "SLURM_JOB_ACCOUNT": "lab", "SLURM_JOB_QOS": "normal",
		"SLURM_JOB_UID": "1000", "SLURM_JOB_USER": "u", "SLURM_JOB_GID": "1000", "SLURM_CLUSTER_NAME": "c",
		"SLURM_SUBMIT_DIR": "/home/u", "SLURM_SUBMIT_HOST": "login1", "SLURM_WORKING_CLUSTER": "c:ctl:6817:9984:109",
		"SLURM_PRIO_PROCESS": "0", "SLURM_UMASK": "0022", "SLURM_DISTRIBUTION": "block", "SLURM_CPUS_PER_TASK": "1",
		"SLURM_CPU_BIND": "quiet,mask_cpu:0x1", "SLURM_CPU_BIND_TYPE": "mask_cpu:", "SLURM_CPU_BIND_LIST": "0x1", "SLURM_CPU_BIND_VERBOSE": "quiet",
		"SLURM_LAUNCH_NODE_IPADDR": "10.0.0.9", "SLURM_SRUN_COMM_HOST": "10.0.0.9", "SLURM_SRUN_COMM_PORT": "40211",
		"SLURM_STEP_LAUNCHER_PORT": "40211", "SLURM_TOPOLOGY_ADDR": host, "SLURM_TOPOLOGY_ADDR_PATTERN": "node",
		"SLURMD_NODENAME": host, "SLURM_CONF": "/etc/slurm/slurm.conf", "SLURM_MPI_TYPE": "none",
		"SLURM_PROCID": strconv.Itoa(procid), "SLURM_NODEID": strconv.Itoa(node), "SLURM_LOCALID": strconv.Itoa(local),
		"SLURM_TASK_PID": strconv.Itoa(30000 + procid),
	}
	for k, v := range job {
		env[k] = v
	}
	return env
}

// Step variables of `srun -N2 -n4` and of `srun -N2 -n3` (2 + 1).
var (
	srun2x2 = map[string]string{
		"SLURM_NTASKS": "4", "SLURM_NPROCS": "4", "SLURM_NNODES": "2", "SLURM_JOB_NUM_NODES": "2",
		"SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_CPUS_PER_NODE": "2(x2)", "SLURM_CPUS_ON_NODE": "2",
		"SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
		"SLURM_NODELIST": "n[1-2]", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_STEP_NODELIST": "n[1-2]",
		"MASTER_ADDR": "n1", // the batch script's export of the first host
	}
	srun2p1 = map[string]string{
		"SLURM_NTASKS": "3", "SLURM_NPROCS": "3", "SLURM_NNODES": "2", "SLURM_JOB_NUM_NODES": "2",
		"SLURM_TASKS_PER_NODE": "2,1", "SLURM_JOB_CPUS_PER_NODE": "2(x2)", "SLURM_CPUS_ON_NODE": "2",
		"SLURM_STEP_NUM_TASKS": "3", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_TASKS_PER_NODE": "2,1",
		"SLURM_NODELIST": "n[1-2]", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_STEP_NODELIST": "n[1-2]",
		"MASTER_ADDR": "n1",
	}
)

// mpirun returns the environment OpenMPI 4.1's `mpirun -np size` gives rank
// (as `mpirun --allow-run-as-root -np 2 env` prints it on this machine),
// with local ranks per host.
func mpirun(rank, size, local, nodes int) map[string]string {
	env := map[string]string{
		"OMPI_APP_CTX_NUM_PROCS": strconv.Itoa(size), "OMPI_COMMAND": "train", "OMPI_FIRST_RANKS": "0",
		"OMPI_FILE_LOCATION":   "/tmp/ompi.vm.0/pid.17073/0/" + strconv.Itoa(rank),
		"OMPI_COMM_WORLD_RANK": strconv.Itoa(rank), "OMPI_COMM_WORLD_SIZE": strconv.Itoa(size),
		"OMPI_COMM_WORLD_LOCAL_RANK": strconv.Itoa(rank % local), "OMPI_COMM_WORLD_LOCAL_SIZE": strconv.Itoa(local),
		"OMPI_COMM_WORLD_NODE_RANK": strconv.Itoa(rank % local),
		"OMPI_MCA_ess":              "^singleton", "OMPI_MCA_ess_base_jobid": "776929281", "OMPI_MCA_ess_base_vpid": strconv.Itoa(rank),
		"OMPI_MCA_initial_wdir": "/tmp", "OMPI_MCA_mpi_oversubscribe": "0", "OMPI_MCA_orte_app_num": "0",
		"OMPI_MCA_orte_bound_at_launch": "1", "OMPI_MCA_orte_ess_node_rank": strconv.Itoa(rank % local),
		"OMPI_MCA_orte_ess_num_procs":      strconv.Itoa(size),
		"OMPI_MCA_orte_hnp_uri":            "776929280.0;tcp://192.0.2.2:32971;tcp6://[fd00::2]:37497",
		"OMPI_MCA_orte_local_daemon_uri":   "776929280.0;tcp://192.0.2.2:32971;tcp6://[fd00::2]:37497",
		"OMPI_MCA_orte_jobfam_session_dir": "/tmp/ompi.vm.0/pid.17073", "OMPI_MCA_orte_launch": "1",
		"OMPI_MCA_orte_num_nodes":               strconv.Itoa(nodes),
		"OMPI_MCA_orte_precondition_transports": "0018f8636d206b70-26645ce462475979",
		"OMPI_MCA_orte_tmpdir_base":             "/tmp", "OMPI_MCA_orte_top_session_dir": "/tmp/ompi.vm.0",
		"OMPI_MCA_pmix": "^s1,s2,cray,isolated", "OMPI_MCA_rmaps_base_oversubscribe": "1",
		"OMPI_MCA_shmem_RUNTIME_QUERY_hint": "mmap", "OMPI_NUM_APP_CTX": "1", "OMPI_UNIVERSE_SIZE": strconv.Itoa(size),
		"PMIX_BFROP_BUFFER_TYPE": "PMIX_BFROP_BUFFER_NON_DESC", "PMIX_GDS_MODULE": "ds21,ds12,hash",
		"PMIX_HOSTNAME": "vm", "PMIX_ID": "776929281." + strconv.Itoa(rank), "PMIX_NAMESPACE": "776929281",
		"PMIX_RANK": strconv.Itoa(rank), "PMIX_SECURITY_MODE": "native", "PMIX_SERVER_TMPDIR": "/tmp/ompi.vm.0/pid.17073",
		"PMIX_SERVER_URI4": "776929280.0;tcp4://127.0.0.1:33225", "PMIX_SYSTEM_TMPDIR": "/tmp", "PMIX_VERSION": "4.2.2rc2",
		"HFI_NO_BACKTRACE": "1", "IPATH_NO_BACKTRACE": "1",
	}
	return env
}

func with(env map[string]string, kv ...string) map[string]string {
	out := map[string]string{}
	for k, v := range env {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == "" {
			delete(out, kv[i])
		} else {
			out[kv[i]] = kv[i+1]
		}
	}
	return out
}

// TestLoadEnvLaunchers reads the environments srun and mpirun give.
func TestLoadEnvLaunchers(t *testing.T) {
	slurmPort := derivedPort("slurm4242.0")
	ompiPort := derivedPort("ompi776929281")
	secret := []byte("0018f8636d206b70-26645ce462475979")
	type where struct{ rank, size, local, lws, node int }
	cases := []struct {
		name   string
		env    map[string]string
		w      where
		addr   string
		port   int
		runID  string
		secret []byte
	}{
		// srun -N2 -n4: no SLURM_NTASKS_PER_NODE.
		{"srun -N2 -n4 rank 0", srun(srun2x2, 0, 0, 0, "n1"), where{0, 4, 0, 2, 0}, "n1", slurmPort, "slurm4242.0", nil},
		{"srun -N2 -n4 rank 1", srun(srun2x2, 1, 0, 1, "n1"), where{1, 4, 1, 2, 0}, "n1", slurmPort, "slurm4242.0", nil},
		{"srun -N2 -n4 rank 2", srun(srun2x2, 2, 1, 0, "n2"), where{2, 4, 0, 2, 1}, "n1", slurmPort, "slurm4242.0", nil},
		{"srun -N2 -n4 rank 3", srun(srun2x2, 3, 1, 1, "n2"), where{3, 4, 1, 2, 1}, "n1", slurmPort, "slurm4242.0", nil},
		{"srun -N2 -n4 --mpi=pmix rank 3", with(srun(srun2x2, 3, 1, 1, "n2"), "SLURM_MPI_TYPE", "pmix", "PMIX_RANK", "3", "PMIX_NAMESPACE", "slurm.pmix.4242.0"),
			where{3, 4, 1, 2, 1}, "n1", slurmPort, "slurm4242.0", nil},
		{"srun -N2 -n4 MASTER_PORT", with(srun(srun2x2, 3, 1, 1, "n2"), "MASTER_PORT", "31000"), where{3, 4, 1, 2, 1}, "n1", 31000, "slurm4242.0", nil},
		// Only the old-style list (before SLURM_STEP_TASKS_PER_NODE).
		{"srun -N2 -n4 no step list", with(srun(srun2x2, 2, 1, 0, "n2"), "SLURM_STEP_TASKS_PER_NODE", "", "SLURM_STEP_NUM_NODES", "", "SLURM_STEP_NUM_TASKS", ""),
			where{2, 4, 0, 2, 1}, "n1", slurmPort, "slurm4242.0", nil},
		// A step on part of an allocation of 4 nodes, which asked for 4
		// tasks per node: the step's own list wins.
		{"srun -N2 -n4 in a 4-node allocation", with(srun(srun2x2, 3, 1, 1, "n2"), "SLURM_JOB_NUM_NODES", "4", "SLURM_NTASKS_PER_NODE", "4", "SLURM_STEP_ID", "3", "SLURM_STEPID", "3"),
			where{3, 4, 1, 2, 1}, "n1", derivedPort("slurm4242.3"), "slurm4242.3", nil},
		// srun -n3 over 2 nodes: 2 + 1.
		{"srun -n3 rank 0", srun(srun2p1, 0, 0, 0, "n1"), where{0, 3, 0, 2, 0}, "n1", slurmPort, "slurm4242.0", nil},
		{"srun -n3 rank 1", srun(srun2p1, 1, 0, 1, "n1"), where{1, 3, 1, 2, 0}, "n1", slurmPort, "slurm4242.0", nil},
		{"srun -n3 rank 2", srun(srun2p1, 2, 1, 0, "n2"), where{2, 3, 0, 1, 1}, "n1", slurmPort, "slurm4242.0", nil},
		// srun -n3 on one node: MASTER_ADDR is not needed.
		{"srun -N1 -n3", with(srun(srun2p1, 2, 0, 2, "n1"), "SLURM_TASKS_PER_NODE", "3", "SLURM_STEP_TASKS_PER_NODE", "3", "SLURM_NNODES", "1",
			"SLURM_JOB_NUM_NODES", "1", "SLURM_STEP_NUM_NODES", "1", "MASTER_ADDR", ""), where{2, 3, 2, 3, 0}, "127.0.0.1", slurmPort, "slurm4242.0", nil},
		{"srun three counts", with(srun(srun2p1, 8, 3, 1, "n4"), "SLURM_NTASKS", "10", "SLURM_STEP_NUM_TASKS", "10", "SLURM_NNODES", "5", "SLURM_JOB_NUM_NODES", "5",
			"SLURM_STEP_NUM_NODES", "5", "SLURM_TASKS_PER_NODE", "3,2(x3),1", "SLURM_STEP_TASKS_PER_NODE", "3,2(x3),1"), where{8, 10, 1, 2, 3}, "n1", slurmPort, "slurm4242.0", nil},
		// mpirun -np 4 on one host: loopback, the job's id, its secret.
		{"mpirun -np 4 rank 0", mpirun(0, 4, 4, 1), where{0, 4, 0, 4, 0}, "127.0.0.1", ompiPort, "ompi776929281", secret},
		{"mpirun -np 4 rank 3", mpirun(3, 4, 4, 1), where{3, 4, 3, 4, 0}, "127.0.0.1", ompiPort, "ompi776929281", secret},
		// OpenMPI 5 names the job only in PMIX_NAMESPACE.
		{"mpirun 5 -np 4", with(mpirun(1, 4, 4, 1), "OMPI_MCA_ess_base_jobid", "", "OMPI_MCA_orte_num_nodes", "", "OMPI_MCA_orte_precondition_transports", "",
			"PMIX_NAMESPACE", "prterun-vm-1734@1"), where{1, 4, 1, 4, 0}, "127.0.0.1", derivedPort("ompiprterun-vm-1734_1"), "ompiprterun-vm-1734_1", nil},
		// mpirun -np 4 -x MASTER_ADDR over 2 hosts.
		{"mpirun 2 hosts rank 1", with(mpirun(1, 4, 2, 2), "MASTER_ADDR", "h0"), where{1, 4, 1, 2, 0}, "h0", ompiPort, "ompi776929281", secret},
		{"mpirun 2 hosts rank 2", with(mpirun(2, 4, 2, 2), "MASTER_ADDR", "h0", "MASTER_PORT", "29600"), where{2, 4, 0, 2, 2}, "h0", 29600, "ompi776929281", secret},
		// OpenMPI names no node: the node's first rank tells nodes apart,
		// of uneven sizes too (mpirun -np 3 --host a:1,b:2).
		{"mpirun --host a:1,b:2 rank 0", with(mpirun(0, 3, 1, 2), "MASTER_ADDR", "a"), where{0, 3, 0, 1, 0}, "a", ompiPort, "ompi776929281", secret},
		{"mpirun --host a:1,b:2 rank 2", with(mpirun(2, 3, 2, 2), "MASTER_ADDR", "a", "OMPI_COMM_WORLD_LOCAL_RANK", "1"), where{2, 3, 1, 2, 1}, "a", ompiPort, "ompi776929281", secret},
		// mpirun inside a Slurm allocation: its ranks inherit the batch
		// step's SLURM_* (node 0, local 0), which describe mpirun, not them.
		{"mpirun in Slurm", with(mpirun(3, 4, 2, 2), "MASTER_ADDR", "h0", "SLURM_JOB_ID", "77", "SLURM_NODEID", "0", "SLURM_LOCALID", "0",
			"SLURM_PROCID", "0", "SLURM_NTASKS", "8", "SLURM_TASKS_PER_NODE", "4(x2)", "SLURM_NNODES", "2"), where{3, 4, 1, 2, 2}, "h0", ompiPort, "ompi776929281", secret},
		// The user's secret and run id win.
		{"mpirun with SLIME_*", with(mpirun(3, 4, 4, 1), "SLIME_JOB_SECRET", "mine", "SLIME_RUN_ID", "r1"), where{3, 4, 3, 4, 0}, "127.0.0.1", ompiPort, "r1", []byte("mine")},
		// A guessable key (OpenMPI direct-launched derives it from the job id) is no secret.
		{"mpirun weak key", with(mpirun(3, 4, 4, 1), "OMPI_MCA_orte_precondition_transports", "012cc14200000000-012cc14200000000"),
			where{3, 4, 3, 4, 0}, "127.0.0.1", ompiPort, "ompi776929281", nil},
		// MPICH's and Intel MPI's mpiexec (Hydra): PMI_RANK, PMI_SIZE,
		// MPI_LOCALRANKID, MPI_LOCALNRANKS. Each rank ran as a world of one.
		{"mpiexec -n 4 rank 3", map[string]string{"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "3", "MPI_LOCALNRANKS": "4", "PMI_FD": "6"},
			where{3, 4, 3, 4, 0}, "127.0.0.1", DefaultPort, "port29500", nil},
		{"mpiexec 2 hosts rank 2", map[string]string{"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2", "MASTER_ADDR": "h0"},
			where{2, 4, 0, 2, 2}, "h0", DefaultPort, "port29500", nil},
		// srun --mpi=pmi2 sets PMI_RANK and PMI_SIZE beside Slurm's own: those win.
		{"srun -N2 -n4 --mpi=pmi2 rank 3", with(srun(srun2x2, 3, 1, 1, "n2"), "PMI_RANK", "3", "PMI_SIZE", "4"),
			where{3, 4, 1, 2, 1}, "n1", slurmPort, "slurm4242.0", nil},
		// mpiexec (Hydra) inside an sbatch script: every rank inherits the
		// batch step's SLURM_PROCID=0 and SLURM_NTASKS; Hydra's variables
		// (MPI_LOCALRANKID, which srun does not set) win. Each rank was
		// rank 0.
		{"mpiexec -n 4 in an sbatch script, rank 3", map[string]string{"SLURM_JOB_ID": "4242", "SLURM_PROCID": "0", "SLURM_NTASKS": "4",
			"SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NNODES": "1", "SLURM_TASKS_PER_NODE": "4",
			"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "3", "MPI_LOCALNRANKS": "4", "PMI_FD": "6"},
			where{3, 4, 3, 4, 0}, "127.0.0.1", DefaultPort, "port29500", nil},
		// A batch script's export WORLD_SIZE (and MASTER_ADDR) before srun,
		// the rank left to each task: Slurm's rank, and its layout with it.
		// The ranks of both nodes took themselves for one node.
		{"srun -N2 -n4, WORLD_SIZE exported", with(srun(srun2x2, 3, 1, 1, "n2"), "WORLD_SIZE", "4"), where{3, 4, 1, 2, 1}, "n1", slurmPort, "slurm4242.0", nil},
		{"mpirun 2 hosts, WORLD_SIZE exported", with(mpirun(2, 4, 2, 2), "MASTER_ADDR", "h0", "WORLD_SIZE", "4"), where{2, 4, 0, 2, 2}, "h0", ompiPort, "ompi776929281", secret},
		// torchrun inside srun: torchrun's variables first.
		{"torchrun in srun", with(srun(srun2x2, 1, 0, 1, "n1"), "RANK", "5", "WORLD_SIZE", "8", "LOCAL_RANK", "1", "LOCAL_WORLD_SIZE", "4",
			"GROUP_RANK", "1", "MASTER_PORT", "29400", "TORCHELASTIC_RUN_ID", "tr"), where{5, 8, 1, 4, 1}, "n1", 29400, "tr", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o, err := LoadEnv(func(k string) string { return tc.env[k] })
			if err != nil {
				t.Fatal(err)
			}
			got := where{o.Rank, o.WorldSize, o.LocalRank, o.LocalWorldSize, o.NodeRank}
			if got != tc.w || o.MasterAddr != tc.addr || o.MasterPort != tc.port || o.RunID != tc.runID || string(o.JobSecret) != string(tc.secret) {
				t.Errorf("rank/size/local/local size/node %v, master %s:%d, run %q, secret %q\nwant %v, %s:%d, %q, %q",
					got, o.MasterAddr, o.MasterPort, o.RunID, o.JobSecret, tc.w, tc.addr, tc.port, tc.runID, tc.secret)
			}
		})
	}
}

// TestLoadEnvLauncherErrors: a launcher's environment that contradicts
// itself is ErrInvalid naming the variables.
func TestLoadEnvLauncherErrors(t *testing.T) {
	r3 := srun(srun2x2, 3, 1, 1, "n2")
	cases := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"sum", with(r3, "SLURM_NTASKS", "5"), `SLURM_NTASKS=5, but SLURM_STEP_TASKS_PER_NODE="2(x2)" places 4 tasks`},
		{"step tasks", with(r3, "SLURM_STEP_NUM_TASKS", "6"), `SLURM_STEP_NUM_TASKS="6", but SLURM_STEP_TASKS_PER_NODE="2(x2)" places 4 tasks`},
		{"nnodes", with(r3, "SLURM_NNODES", "3"), `SLURM_NNODES="3", but SLURM_STEP_TASKS_PER_NODE="2(x2)" lists 2 nodes`},
		{"step nodes", with(r3, "SLURM_STEP_NUM_NODES", "1"), `SLURM_STEP_NUM_NODES="1", but SLURM_STEP_TASKS_PER_NODE="2(x2)" lists 2 nodes`},
		{"job nodes", with(r3, "SLURM_JOB_NUM_NODES", "1"), `SLURM_JOB_NUM_NODES="1", but SLURM_STEP_TASKS_PER_NODE="2(x2)" lists 2 nodes`},
		{"node id", with(r3, "SLURM_NODEID", "2"), `SLURM_NODEID=2, but SLURM_STEP_TASKS_PER_NODE="2(x2)" lists 2 nodes`},
		{"no node id", with(r3, "SLURM_NODEID", ""), `lists 2 nodes, but SLURM_NODEID is not set`},
		{"local id", with(r3, "SLURM_LOCALID", "2"), "local rank 2 of local world size 2"},
		{"no counts", with(r3, "SLURM_TASKS_PER_NODE", "", "SLURM_STEP_TASKS_PER_NODE", ""), "SLURM_LOCALID is set but not how many tasks"},
		{"old list", with(r3, "SLURM_STEP_TASKS_PER_NODE", "", "SLURM_TASKS_PER_NODE", "2(x3)"), `SLURM_NTASKS=4, but SLURM_TASKS_PER_NODE="2(x3)" places 6 tasks`},
		{"mpirun 2 hosts, no MASTER_ADDR", mpirun(1, 4, 2, 2), "MASTER_ADDR is not set"},
	}
	for _, form := range []string{"2(x2", "2x2", "2(x0)", "0,4", "2,,2", ",4", "4,", "2(y2)", "-1,5", "+2,2", "2 ,2", "2(x2)(x1)",
		"(x2)", "2()", "a", "99999999999", "1(x70000)", "1(x40000),1(x40000)", "2(x-2)", "2(x+2)", "2(x 2)", "2(x2),"} {
		cases = append(cases, struct {
			name string
			env  map[string]string
			want string
		}{"form " + form, with(r3, "SLURM_STEP_TASKS_PER_NODE", form), fmt.Sprintf("SLURM_STEP_TASKS_PER_NODE=%q: ", form)})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadEnv(func(k string) string { return tc.env[k] })
			if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v; want ErrInvalid containing %q", err, tc.want)
			}
		})
	}
}

func TestParseTasksPerNode(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
	}{
		{"4", []int{4}}, {"2(x2)", []int{2, 2}}, {"2,1", []int{2, 1}}, {"3,2(x3),1", []int{3, 2, 2, 2, 1}},
		{"1(x1)", []int{1}}, {"8(x2),16", []int{8, 8, 16}},
	} {
		got, err := parseTasksPerNode(tc.in)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q: %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	if got, err := parseTasksPerNode("1(x65536)"); err != nil || len(got) != maxSlurmNodes {
		t.Errorf("the most nodes: %d, %v", len(got), err)
	}
}

// FuzzParseTasksPerNode: any input expands within the bounds, or fails;
// what parses, written back in Slurm's form, parses the same.
func FuzzParseTasksPerNode(f *testing.F) {
	for _, s := range []string{"2(x2)", "2,1", "3,2(x3),1", "1(x65536)", "2(x", "0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		counts, err := parseTasksPerNode(s)
		if err != nil {
			return
		}
		if len(counts) == 0 || len(counts) > maxSlurmNodes {
			t.Fatalf("%q: %d nodes", s, len(counts))
		}
		var parts []string
		for i := 0; i < len(counts); {
			j := i
			for j < len(counts) && counts[j] == counts[i] {
				j++
			}
			if counts[i] < 1 || counts[i] > maxSlurmTasks {
				t.Fatalf("%q: count %d", s, counts[i])
			}
			parts = append(parts, fmt.Sprintf("%d(x%d)", counts[i], j-i))
			i = j
		}
		again, err := parseTasksPerNode(strings.Join(parts, ","))
		if err != nil || !reflect.DeepEqual(again, counts) {
			t.Fatalf("%q: %v; written back: %v, %v", s, counts, again, err)
		}
	})
}

// TestDerivedPort: concurrent jobs' ports stay out of the ephemeral range
// and apart.
func TestDerivedPort(t *testing.T) {
	seen := map[int]bool{}
	for i := range 200 {
		p := derivedPort("ompi" + strconv.Itoa(776929281+i*65536))
		if p < 20000 || p >= 30000 {
			t.Fatalf("port %d", p)
		}
		seen[p] = true
	}
	if len(seen) < 190 {
		t.Errorf("200 job ids got %d ports", len(seen))
	}
	if derivedPort("slurm1.0") != derivedPort("slurm1.0") || derivedPort("slurm1.0") == derivedPort("slurm1.1") {
		t.Error("not a function of the job id alone")
	}
}

func TestSanitizeID(t *testing.T) {
	long := strings.Repeat("a", 70)
	for in, want := range map[string]string{"776929281": "776929281", "prterun-vm-1734@1": "prterun-vm-1734_1", "a/../b": "a_.._b", "": ""} {
		if got := sanitizeID(in); got != want {
			t.Errorf("%q: %q", in, got)
		}
	}
	if a, b := sanitizeID(long+"1"), sanitizeID(long+"2"); len(a) != 64 || a == b {
		t.Errorf("long ids: %q %q", a, b)
	}
}

// Options.GPUBlocks set in code is checked as SLIME_GPU_BLOCKS is: 0 is
// the default, and a count outside 1..MaxGPUBlocks is refused by name.
func TestGPUBlocksValidated(t *testing.T) {
	base := Options{Job: Job{WorldSize: 1, LocalWorldSize: 1, RunID: "x"}, TCP: TCP{Algo: "auto"}}
	for _, tc := range []struct {
		blocks int
		ok     bool
	}{{0, true}, {1, true}, {MaxGPUBlocks, true}, {-1, false}, {MaxGPUBlocks + 1, false}} {
		o := base
		o.GPUBlocks = tc.blocks
		err := o.validate()
		if tc.ok != (err == nil) || err != nil && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "GPU thread blocks")) {
			t.Errorf("GPUBlocks %d: %v", tc.blocks, err)
		}
	}
}

// TestLoadEnvErrorNamesRank: under a launcher whose tasks all print the
// same words to one stream (srun without -l, mpirun), an environment error
// names the rank that met it.
func TestLoadEnvErrorNamesRank(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"srun, no MASTER_ADDR", with(srun(srun2x2, 3, 1, 1, "n2"), "MASTER_ADDR", ""), "environment of rank 3 (SLURM_PROCID): "},
		{"srun, bad local id", with(srun(srun2x2, 2, 1, 2, "n2")), "environment of rank 2 (SLURM_PROCID): "},
		{"mpirun, no MASTER_ADDR", mpirun(1, 4, 2, 2), "environment of rank 1 (OMPI_COMM_WORLD_RANK): "},
		{"bad rank variable", map[string]string{"RANK": "x", "WORLD_SIZE": "2"}, `collective: environment: slimego: invalid argument: RANK="x"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadEnv(func(k string) string { return tc.env[k] })
			if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v; want ErrInvalid containing %q", err, tc.want)
			}
		})
	}
}
