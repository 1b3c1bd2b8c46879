package launcher

import (
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestBindToCore: with BindToCore each local rank runs on one CPU of its
// own, the launcher's CPUs in order, and so do the processes it starts;
// the launcher's own CPUs are as before. Without it a worker may run on
// all of them. More workers than CPUs are dealt the CPUs round: rank i on
// CPU i mod n.
func TestBindToCore(t *testing.T) {
	cpus, err := allowedCPUs()
	if err != nil {
		t.Fatal(err)
	}
	list := func(out string, rank int) string {
		prefix := "[" + strconv.Itoa(rank) + "]: "
		for _, line := range strings.Split(out, "\n") {
			if v, ok := strings.CutPrefix(line, prefix); ok {
				return strings.TrimSpace(v)
			}
		}
		return "(no line)"
	}
	n := min(2, len(cpus))
	script := `sh -c 'grep Cpus_allowed_list /proc/self/status' | cut -f2`
	out, stderr, err := run(t, Config{NProcPerNode: n, BindToCore: true}, script)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	for r := range n {
		if got, want := list(out, r), strconv.Itoa(cpus[r]); got != want {
			t.Errorf("bound: rank %d runs on CPUs %s, want %s", r, got, want)
		}
	}
	after, err := allowedCPUs()
	if err != nil || !slices.Equal(after, cpus) {
		t.Errorf("the launcher's CPUs after binding: %v (%v), want %v", after, err, cpus)
	}
	if len(cpus) > 1 {
		out, stderr, err = run(t, Config{NProcPerNode: 1}, script)
		if err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		if got := list(out, 0); got == strconv.Itoa(cpus[0]) {
			t.Errorf("unbound: rank 0 runs on CPU %s alone", got)
		}
	}
	n = 2*len(cpus) + 1
	out, stderr, err = run(t, Config{NProcPerNode: n, BindToCore: true}, script)
	if err != nil {
		t.Fatalf("%d workers bound to %d CPUs: %v\n%s", n, len(cpus), err, stderr)
	}
	for r := range n {
		if got, want := list(out, r), strconv.Itoa(cpus[r%len(cpus)]); got != want {
			t.Errorf("%d workers on %d CPUs: rank %d runs on CPUs %s, want %s", n, len(cpus), r, got, want)
		}
	}
}
