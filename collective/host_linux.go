package collective

import "github.com/slimego/slimego/internal/machine"

// hostID names the machine this process runs on in a layout entry: its
// boot id, so that nodes that share one machine's cores (namespaces
// standing in for nodes, containers) find each other; "-" where it cannot
// be read or is not one.
func hostID() string {
	s := machine.BootID()
	if s == "" || s == "-" || !validHostID(s) {
		return "-"
	}
	return s
}
