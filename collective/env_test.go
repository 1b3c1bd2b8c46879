package collective

import (
	"errors"
	"fmt"
	"reflect"
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
			Options{Rank: 0, WorldSize: 1, LocalWorldSize: 1, MasterPort: 29500, RunID: "port29500"}},
		{"torchrun", map[string]string{"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
			"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234", "TORCHELASTIC_RUN_ID": "job", "TORCHELASTIC_USE_AGENT_STORE": "True"},
			Options{Rank: 5, WorldSize: 8, LocalRank: 1, LocalWorldSize: 4, NodeRank: 1, MasterAddr: "10.0.0.1", MasterPort: 1235, RunID: "job"}},
		{"slimerun", map[string]string{"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "0",
			"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29600", "SLIME_AGENT_STORE": "1", "SLIME_RUN_ID": "abc", "SLIME_RESTART_COUNT": "2",
			"SLIME_TIMEOUT": "90s", "SLIME_BACKEND": "cpu", "SLIME_SLOT_BYTES": "128K"},
			Options{Rank: 2, WorldSize: 4, LocalRank: 2, LocalWorldSize: 4, MasterAddr: "127.0.0.1", MasterPort: 29600, AgentStore: true,
				RunID: "abc", Attempt: 2, Timeout: 90 * time.Second, Backend: device.CPU, SlotBytes: 128 << 10}},
		{"openmpi", map[string]string{"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
			"OMPI_COMM_WORLD_LOCAL_SIZE": "2", "MASTER_ADDR": "h0", "SLIME_TIMEOUT": "2.5"},
			Options{Rank: 3, WorldSize: 4, LocalRank: 1, LocalWorldSize: 2, NodeRank: 1, MasterAddr: "h0", MasterPort: 29500, RunID: "port29500", Timeout: 2500 * time.Millisecond}},
		{"knobs", map[string]string{"SLIME_RCVLOWAT": "1M", "SLIME_EAGER": "1", "SLIME_GPU_SCRATCH": "4M", "SLIME_CHANNELS": "4"},
			Options{WorldSize: 1, LocalWorldSize: 1, MasterPort: 29500, RunID: "port29500", RcvLowat: 1 << 20, Eager: true, GPUScratch: 4 << 20, Channels: 4}},
		{"lowat off", map[string]string{"SLIME_RCVLOWAT": "off"},
			Options{WorldSize: 1, LocalWorldSize: 1, MasterPort: 29500, RunID: "port29500", RcvLowat: -1}},
		{"send copy", map[string]string{"SLIME_SEND_COPY_MIN": "48M"},
			Options{WorldSize: 1, LocalWorldSize: 1, MasterPort: 29500, RunID: "port29500", SendCopyMin: 48 << 20}},
		{"send copy off", map[string]string{"SLIME_SEND_COPY_MIN": "-1"},
			Options{WorldSize: 1, LocalWorldSize: 1, MasterPort: 29500, RunID: "port29500", SendCopyMin: -1}},
		{"slurm", map[string]string{"SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_LOCALID": "2", "SLURM_NTASKS_PER_NODE": "4", "SLURM_NODEID": "1", "MASTER_ADDR": "n1"},
			Options{Rank: 6, WorldSize: 8, LocalRank: 2, LocalWorldSize: 4, NodeRank: 1, MasterAddr: "n1", MasterPort: 29500, RunID: "port29500"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := LoadEnv(func(k string) string { return tc.env[k] })
			if err != nil {
				t.Fatal(err)
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
		{map[string]string{"RANK": "0", "WORLD_SIZE": "6", "LOCAL_RANK": "4", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "x"}, "local rank 4 of local world size 4"},
		{map[string]string{"SLIME_ALGO": "tree"}, "SLIME_ALGO"},
		{map[string]string{"MASTER_PORT": "70000"}, "not a TCP port"},
		{map[string]string{"SLIME_TIMEOUT": "-3s"}, "SLIME_TIMEOUT"},
		{map[string]string{"SLIME_BACKEND": "tpu"}, "unknown backend"},
		{map[string]string{"SLIME_SLOT_BYTES": "lots"}, "SLIME_SLOT_BYTES"},
		{map[string]string{"SLIME_RCVLOWAT": "big"}, "SLIME_RCVLOWAT"},
		{map[string]string{"SLIME_EAGER": "maybe"}, "SLIME_EAGER"},
		{map[string]string{"SLIME_GPU_SCRATCH": "0"}, "SLIME_GPU_SCRATCH"},
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
	}
	for _, tc := range cases {
		at := func(r int) (int, int, int) { return tc.ranks[r].node, tc.ranks[r].local, tc.ranks[r].size }
		lay, err := buildLayout(0, at, len(tc.ranks))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
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
