package launcher

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestConfigDefaults checks what Config.defaults fills in, keeps and
// refuses, value by value: the boundaries of each range, and that a value
// the caller set is never replaced by a default.
func TestConfigDefaults(t *testing.T) {
	defer func(f func() int) { numCPU = f }(numCPU)
	var stderr bytes.Buffer
	secretFile := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secretFile, []byte("from-the-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := func(c Config) Config {
		if c.NNodes == 0 && !c.Standalone {
			c.NNodes = 1
		}
		if c.NProcPerNode == 0 {
			c.NProcPerNode = 1
		}
		if c.Program == "" {
			c.Program = "true"
		}
		if c.Env == nil {
			c.Env = []string{}
		}
		return c
	}
	for _, tc := range []struct {
		name  string
		cfg   Config
		cores int
		bad   string // a part of the ErrBadConfig message; "" when accepted
		check func(t *testing.T, c Config)
	}{
		{name: "standalone refuses more nodes", cfg: Config{Standalone: true, NNodes: 3, NodeRank: 2}, bad: "--standalone runs one node; --nnodes 3 --node-rank 2"},
		{name: "standalone fills one node on loopback", cfg: Config{Standalone: true},
			check: func(t *testing.T, c Config) {
				if c.NNodes != 1 || c.NodeRank != 0 || c.MasterAddr != "127.0.0.1" || c.MasterPort != 0 {
					t.Errorf("nodes %d, node rank %d, master %s:%d; want 1, 0, 127.0.0.1:0 (a free port)", c.NNodes, c.NodeRank, c.MasterAddr, c.MasterPort)
				}
			}},
		{name: "standalone keeps its master address", cfg: Config{Standalone: true, MasterAddr: "127.0.0.2"},
			check: func(t *testing.T, c Config) {
				if c.MasterAddr != "127.0.0.2" {
					t.Errorf("master %q, want 127.0.0.2 kept", c.MasterAddr)
				}
			}},
		{name: "no nodes", cfg: Config{NNodes: -1}, bad: "--nnodes -1"},
		{name: "no workers", cfg: Config{NProcPerNode: -1}, bad: "--nproc-per-node -1"},
		{name: "node rank negative", cfg: Config{NNodes: 2, NodeRank: -1, MasterAddr: "x"}, bad: "--node-rank -1"},
		{name: "node rank = nodes", cfg: Config{NNodes: 2, NodeRank: 2, MasterAddr: "x"}, bad: "--node-rank 2 is not in [0, 2)"},
		{name: "last node rank", cfg: Config{NNodes: 2, NodeRank: 1, MasterAddr: "10.0.0.1"},
			check: func(t *testing.T, c Config) {
				if c.MasterAddr != "10.0.0.1" || c.MasterPort != 29500 {
					t.Errorf("master %s:%d, want 10.0.0.1:29500", c.MasterAddr, c.MasterPort)
				}
			}},
		{name: "two nodes need a master", cfg: Config{NNodes: 2}, bad: "--master-addr is required"},
		{name: "one node defaults to loopback", cfg: Config{NNodes: 1},
			check: func(t *testing.T, c Config) {
				if c.MasterAddr != "127.0.0.1" || c.MasterPort != 29500 {
					t.Errorf("master %s:%d, want 127.0.0.1:29500", c.MasterAddr, c.MasterPort)
				}
			}},
		{name: "port 65535", cfg: Config{MasterPort: 65535},
			check: func(t *testing.T, c Config) {
				if c.MasterPort != 65535 {
					t.Errorf("port %d, want 65535 kept", c.MasterPort)
				}
			}},
		{name: "port 65536", cfg: Config{MasterPort: 65536}, bad: "--master-port 65536"},
		{name: "port -1", cfg: Config{MasterPort: -1}, bad: "--master-port -1"},
		{name: "durations default", cfg: Config{},
			check: func(t *testing.T, c Config) {
				if c.MonitorInterval != 100*time.Millisecond || c.StopGrace != 5*time.Second || c.RdzvTimeout != 5*time.Minute {
					t.Errorf("monitor %v, stop grace %v, rendezvous timeout %v; want 100ms, 5s, 5m", c.MonitorInterval, c.StopGrace, c.RdzvTimeout)
				}
				if c.Stdout != os.Stdout || c.Stderr != os.Stderr || c.Logf == nil || c.Warnf == nil {
					t.Errorf("console and loggers not defaulted")
				}
			}},
		{name: "durations kept", cfg: Config{MonitorInterval: time.Millisecond, StopGrace: time.Second, RdzvTimeout: time.Second, Stderr: &stderr, Stdout: &stderr},
			check: func(t *testing.T, c Config) {
				if c.MonitorInterval != time.Millisecond || c.StopGrace != time.Second || c.RdzvTimeout != time.Second {
					t.Errorf("monitor %v, stop grace %v, rendezvous timeout %v; want what was set", c.MonitorInterval, c.StopGrace, c.RdzvTimeout)
				}
				if c.Stderr != &stderr || c.Stdout != &stderr {
					t.Errorf("console replaced")
				}
			}},
		// With 2 cores the limits are 2×: on 1 core a * turned / would not show.
		{name: "128 workers on 2 cores", cfg: Config{NProcPerNode: 2 * MaxWorkersPerCore}, cores: 2},
		{name: "129 workers on 2 cores", cfg: Config{NProcPerNode: 2*MaxWorkersPerCore + 1}, cores: 2, bad: "--force"},
		// The store's barriers wait for at most MaxWorkers members: more
		// nodes or workers crashed the launcher (a barrier's slice of
		// that many keys) or failed it "connection lost".
		{name: "most nodes", cfg: Config{NNodes: MaxWorkers, MasterAddr: "x"}},
		{name: "nodes past the barrier", cfg: Config{NNodes: MaxWorkers + 1, MasterAddr: "x"}, bad: "--nnodes 65536: a job runs at most 65535 nodes"},
		{name: "workers past the barrier", cfg: Config{NNodes: 2, NProcPerNode: 40000, MasterAddr: "x", Force: true}, bad: "--nnodes 2 × --nproc-per-node 40000 workers: a job runs at most 65535"},
		{name: "workers past the barrier on one node", cfg: Config{NProcPerNode: 1 << 40, Force: true}, bad: "a job runs at most 65535 workers"},
		{name: "workers overflow", cfg: Config{NNodes: 1 << 62, NProcPerNode: 4, MasterAddr: "x"}, bad: "--nnodes 4611686018427387904: a job runs at most"},
		{name: "secret from the environment", cfg: Config{Env: []string{"SLIME_JOB_SECRET=s3"}},
			check: func(t *testing.T, c Config) {
				if string(c.JobSecret) != "s3" {
					t.Errorf("secret %q, want s3", c.JobSecret)
				}
			}},
		{name: "secret from a file", cfg: Config{Env: []string{"SLIME_JOB_SECRET_FILE= " + secretFile + " "}},
			check: func(t *testing.T, c Config) {
				if string(c.JobSecret) != "from-the-file" {
					t.Errorf("secret %q, want the file's", c.JobSecret)
				}
			}},
		{name: "blank secret file name ignored", cfg: Config{Env: []string{"SLIME_JOB_SECRET_FILE=  "}},
			check: func(t *testing.T, c Config) {
				if len(c.JobSecret) != 0 {
					t.Errorf("secret %q, want none", c.JobSecret)
				}
			}},
		{name: "secret given wins", cfg: Config{JobSecret: []byte("mine"), Env: []string{"SLIME_JOB_SECRET=env"}},
			check: func(t *testing.T, c Config) {
				if string(c.JobSecret) != "mine" {
					t.Errorf("secret %q, want mine", c.JobSecret)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cores := tc.cores
			if cores == 0 {
				cores = 1
			}
			numCPU = func() int { return cores }
			c := base(tc.cfg)
			var warned []string
			if c.Warnf == nil && tc.name != "durations default" {
				c.Warnf = func(f string, a ...any) { warned = append(warned, f) }
			}
			err := c.defaults()
			if tc.bad != "" {
				if !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), tc.bad) {
					t.Fatalf("err = %v, want ErrBadConfig with %q", err, tc.bad)
				}
				return
			}
			if err != nil {
				t.Fatalf("err = %v", err)
			}
			if tc.check != nil {
				tc.check(t, c)
			}
		})
	}
	numCPU = func() int { return 2 }
	for _, tc := range []struct {
		n    int
		warn bool
	}{{2 * WarnWorkersPerCore, false}, {2*WarnWorkersPerCore + 1, true}} {
		var warned []string
		c := base(Config{NProcPerNode: tc.n, Warnf: func(f string, a ...any) { warned = append(warned, f) }})
		if err := c.defaults(); err != nil || (len(warned) > 0) != tc.warn {
			t.Errorf("%d workers on 2 cores: err %v, warnings %q; want a warning: %v", tc.n, err, warned, tc.warn)
		}
	}
	c := Config{NNodes: 1, NProcPerNode: 1, Env: []string{}}
	if err := c.defaults(); !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), "no program") {
		t.Errorf("no program: err = %v", err)
	}
}

// TestErrorText checks the words a user reads: how a worker ended, and
// which rank the others blame (rank 0 included: it is a rank like any
// other, not "none").
func TestErrorText(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&WorkerError{Rank: 1, LocalRank: 1, Pid: 7, ExitCode: 3}, "rank 1 (local rank 1, pid 7) exited with code 3"},
		{&WorkerError{Rank: 1, LocalRank: 1, Pid: 7, ExitCode: 0}, "rank 1 (local rank 1, pid 7) exited with code 0"},
		{&WorkerError{Rank: 2, LocalRank: 0, Pid: 8, ExitCode: -1, Signal: syscall.SIGKILL}, "rank 2 (local rank 0, pid 8) was killed by signal 9 (killed)"},
		{&JobError{First: &WorkerError{Rank: 1, Pid: 7, ExitCode: 1}, Blamed: -1}, "first failure: rank 1 (local rank 0, pid 7) exited with code 1"},
		{&JobError{First: &WorkerError{Rank: 1, Pid: 7, ExitCode: 1}, Blamed: 0, Summary: "rank 0 did not exit"},
			"rank 0 is the one the others' errors name (rank 0 did not exit); first failure: rank 1 (local rank 0, pid 7) exited with code 1"},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("got  %q\nwant %q", got, tc.want)
		}
	}
}

// TestStoreGrace: node 0's store waits for the other nodes only where
// there are others.
func TestStoreGrace(t *testing.T) {
	if g := storeGrace(&Config{NNodes: 1}); g != 0 {
		t.Errorf("one node: grace %v, want 0", g)
	}
	if g := storeGrace(&Config{NNodes: 2}); g != 10*time.Second {
		t.Errorf("two nodes: grace %v, want 10s", g)
	}
}
