package collective

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestStorePortInUse: rank 0 that cannot host the store because its port
// is taken says so and how to choose another; where no MASTER_PORT was
// given (srun, mpirun), it says the port was derived from the run id,
// which the user never saw (it said only "bind: address already in use").
func TestStorePortInUse(t *testing.T) {
	hold := func(t *testing.T, port int) bool {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			return false
		}
		t.Cleanup(func() { l.Close() })
		return true
	}
	for _, tc := range []struct {
		name string
		env  func(t *testing.T) (port int, want string)
	}{
		{"torchrun's variables", func(t *testing.T) (int, string) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
			port := l.Addr().(*net.TCPAddr).Port
			for k, v := range map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": strconv.Itoa(port)} {
				t.Setenv(k, v)
			}
			return port, "port " + strconv.Itoa(port) + " is in use (another process, or another job on this host): give the job another MASTER_PORT"
		}},
		{"srun's, no MASTER_PORT", func(t *testing.T) (int, string) {
			for id := 4242; ; id++ {
				run := "slurm" + strconv.Itoa(id) + ".0"
				if port := derivedPort(run); hold(t, port) {
					for k, v := range map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
						"SLURM_TASKS_PER_NODE": "2", "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_JOB_ID": strconv.Itoa(id), "SLURM_STEP_ID": "0"} {
						t.Setenv(k, v)
					}
					return port, "port " + strconv.Itoa(port) + " is in use (another process, or another job on this host): give the job another MASTER_PORT (this one is derived from the run id " + run + ", as none is set)"
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, want := tc.env(t)
			t.Setenv("SLIME_TIMEOUT", "2s")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := Init(ctx, Options{})
			if err == nil {
				c.Close()
				t.Fatal("Init succeeded on a port in use")
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
				t.Fatalf("err = %v\nwant ErrInvalid containing %q", err, want)
			}
		})
	}
}
