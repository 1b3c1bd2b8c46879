package launcher

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/slimego/slimego/internal/machine"
)

// Nodes of one job may be namespaces or containers of one machine. Each
// node's launcher sees only its own workers, so with BindToCore every
// node would bind its local rank 0 to the first CPU, its rank 1 to the
// second, and so on: the nodes' ranks would pile onto the same cores
// (mpirun across such nodes binds them all to core 0). So each node
// publishes its machine (the kernel's boot id, the same in every
// namespace) and the CPUs it binds to, and a node starts dealing its CPUs
// after the ranks of the earlier nodes that share both.

// placeKey is where node n publishes its placement.
func placeKey(runID string, node int) string {
	return "slimerun/" + runID + "/placement/" + strconv.Itoa(node)
}

// maxPlacement bounds a placement entry read from the store.
const maxPlacement = 1 << 14

// placement is node's entry: "HOST CPUS", its machine's boot id ("-" where
// it cannot be read) and the CPUs its ranks may be bound to, a
// comma-separated list in order ("-" where they cannot be read).
func placement(cpus []int) string {
	host, list := machine.ID(), "-"
	if len(cpus) > 0 {
		s := make([]string, len(cpus))
		for i, c := range cpus {
			s[i] = strconv.Itoa(c)
		}
		list = strings.Join(s, ",")
	}
	return host + " " + list
}

// parsePlacement checks an entry another node published: two fields, a
// machine name of hex digits and dashes (or "-"), a CPU list of numbers
// and commas (or "-").
func parsePlacement(b []byte) (host, cpus string, err error) {
	if len(b) > maxPlacement {
		return "", "", fmt.Errorf("placement of %d bytes, more than %d", len(b), maxPlacement)
	}
	f := strings.Split(string(b), " ")
	if len(f) != 2 || !machine.ValidID(f[0]) || !validCPUList(f[1]) {
		return "", "", fmt.Errorf("placement %.128q is not a machine and a CPU list", b)
	}
	return f[0], f[1], nil
}

// validCPUList accepts "-" and comma-separated decimal numbers.
func validCPUList(s string) bool {
	if s == "-" {
		return true
	}
	for part := range strings.SplitSeq(s, ",") {
		if part == "" || len(part) > 7 {
			return false
		}
		for _, c := range []byte(part) {
			if c < '0' || c > '9' {
				return false
			}
		}
	}
	return true
}

// sharesCPUs says whether two placements bind to the same CPUs of one
// machine: both machines named, the same, with the same CPU list.
func sharesCPUs(aHost, aCPUs, bHost, bCPUs string) bool {
	return aHost != "-" && aCPUs != "-" && aHost == bHost && aCPUs == bCPUs
}
