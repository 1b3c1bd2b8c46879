package intra

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slimego/slimego/internal/teststore"
	"github.com/slimego/slimego/rendezvous"
)

// startBound starts a sleep that may run on cpu only (the child inherits
// the forking thread's CPU mask, as slimerun --bind-to core starts ranks).
func startBound(t *testing.T, cpu int) int {
	t.Helper()
	return startBoundCmd(t, cpu, exec.Command("sleep", "30")).Process.Pid
}

func startBoundCmd(t *testing.T, cpu int, cmd *exec.Cmd) *exec.Cmd {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var old, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		t.Fatal(err)
	}
	one.Set(cpu)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		t.Fatal(err)
	}
	err := cmd.Start()
	if e := unix.SchedSetaffinity(0, &old); e != nil {
		t.Fatal(e)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

// twoCPUs returns two CPUs this process may run on, or skips the test.
func twoCPUs(t *testing.T) (unix.CPUSet, []int) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil || set.Count() < 2 {
		t.Skipf("needs 2 CPUs to bind to (%d, %v)", set.Count(), err)
	}
	var cpus []int
	for c := 0; len(cpus) < 2; c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return set, cpus
}

// TestBoundRanksNotOversubscribed: two ranks in processes of their own,
// each bound to a CPU of its own (so that each process's runtime sees one
// CPU), are not oversubscribed: together they have two. Bound both to one
// CPU, they are. (Taken for oversubscribed, bound ranks yielded at every
// poll and their transports never polled: 2.4 µs per 8-byte all-gather
// where 0.4 was the unbound figure.)
func TestBoundRanksNotOversubscribed(t *testing.T) {
	if os.Getenv("INTRA_BOUND_RANK") != "" {
		return // a rank's process runs boundRank from TestMain's path below
	}
	_, cpus := twoCPUs(t)
	for _, tc := range []struct {
		name string
		on   [2]int
		want bool
	}{{"apart", [2]int{cpus[0], cpus[1]}, false}, {"together", [2]int{cpus[0], cpus[0]}, true}} {
		addr := teststore.Serve(t, rendezvous.ServerConfig{})
		var cmds [2]*exec.Cmd
		var outs [2]strings.Builder
		for r := range 2 {
			cmd := exec.Command(os.Args[0], "-test.run=^TestBoundRank$")
			cmd.Env = append(os.Environ(), "INTRA_BOUND_RANK="+strconv.Itoa(r), "INTRA_BOUND_STORE="+addr,
				"INTRA_BOUND_PREFIX="+fmt.Sprintf("slimego-test-%d-%s-", os.Getpid(), tc.name))
			cmd.Stdout, cmd.Stderr = &outs[r], &outs[r]
			cmds[r] = startBoundCmd(t, tc.on[r], cmd)
		}
		for r, cmd := range cmds {
			err := cmd.Wait()
			out := outs[r].String()
			if err != nil {
				t.Fatalf("%s: rank %d: %v\n%s", tc.name, r, err, out)
			}
			if want := fmt.Sprintf("oversubscribed %v", tc.want); !strings.Contains(out, want) {
				t.Errorf("%s: rank %d: want %q\n%s", tc.name, r, want, out)
			}
		}
	}
}

// TestBoundRank is one rank of TestBoundRanksNotOversubscribed, in a
// process of its own; it does nothing when run otherwise.
func TestBoundRank(t *testing.T) {
	rank := os.Getenv("INTRA_BOUND_RANK")
	if rank == "" {
		t.Skip("a rank of TestBoundRanksNotOversubscribed")
	}
	r, _ := strconv.Atoi(rank)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := rendezvous.Dial(ctx, os.Getenv("INTRA_BOUND_STORE"), rendezvous.Auth{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	g, err := New(ctx, Config{Store: st, Key: "b", ShmPrefix: os.Getenv("INTRA_BOUND_PREFIX"), Rank: r, Size: 2, Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	fmt.Printf("rank %d: %d CPU(s) of its own, oversubscribed %v\n", r, runtime.NumCPU(), g.Oversubscribed())
	if err := g.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestCPUsOf: the CPUs ranks may run on are counted together: two ranks
// bound to one CPU each have two, both on one CPU have one, an unbound
// one has this process's; a rank whose mask cannot be read gives 0 (the
// caller then counts this process's CPUs).
func TestCPUsOf(t *testing.T) {
	set, cpus := twoCPUs(t)
	a, b, c := startBound(t, cpus[0]), startBound(t, cpus[1]), startBound(t, cpus[0])
	for _, tc := range []struct {
		name string
		pids []int
		want int
	}{
		{"each bound to a CPU of its own", []int{a, b}, 2},
		{"one bound", []int{a}, 1},
		{"two bound to one CPU", []int{a, c}, 1},
		{"one unbound", []int{a, os.Getpid()}, set.Count()},
		{"one gone", []int{a, 1 << 30}, 0},
	} {
		if got := cpusOf(tc.pids); got != tc.want {
			t.Errorf("%s: cpusOf = %d, want %d", tc.name, got, tc.want)
		}
	}
}
