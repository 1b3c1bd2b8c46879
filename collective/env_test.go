package collective

import (
	"errors"
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
				RunID: "abc-r2", Timeout: 90 * time.Second, Backend: device.CPU, SlotBytes: 128 << 10}},
		{"openmpi", map[string]string{"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
			"OMPI_COMM_WORLD_LOCAL_SIZE": "2", "MASTER_ADDR": "h0", "SLIME_TIMEOUT": "2.5"},
			Options{Rank: 3, WorldSize: 4, LocalRank: 1, LocalWorldSize: 2, NodeRank: 1, MasterAddr: "h0", MasterPort: 29500, RunID: "port29500", Timeout: 2500 * time.Millisecond}},
		{"slurm", map[string]string{"SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_LOCALID": "2", "SLURM_NTASKS_PER_NODE": "4", "SLURM_NODEID": "1", "MASTER_ADDR": "n1"},
			Options{Rank: 6, WorldSize: 8, LocalRank: 2, LocalWorldSize: 4, NodeRank: 1, MasterAddr: "n1", MasterPort: 29500, RunID: "port29500"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := LoadEnv(func(k string) string { return tc.env[k] })
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
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
		{map[string]string{"RANK": "0", "WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "x"}, "not a multiple"},
		{map[string]string{"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1", "MASTER_ADDR": "x"}, "laid out node by node"},
		{map[string]string{"MASTER_PORT": "70000"}, "not a TCP port"},
		{map[string]string{"SLIME_TIMEOUT": "-3s"}, "SLIME_TIMEOUT"},
		{map[string]string{"SLIME_BACKEND": "tpu"}, "unknown backend"},
		{map[string]string{"SLIME_SLOT_BYTES": "lots"}, "SLIME_SLOT_BYTES"},
	}
	for _, tc := range cases {
		_, err := LoadEnv(func(k string) string { return tc.env[k] })
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v; want ErrInvalid containing %q", tc.env, err, tc.want)
		}
	}
}
