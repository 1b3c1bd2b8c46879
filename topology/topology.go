// Package topology describes the machine a rank runs on: its CPUs and NUMA
// nodes (from /sys) and its GPUs through NVML (github.com/NVIDIA/go-nvml,
// which opens libnvidia-ml.so.1 at run time, so that nothing is needed to
// build): names, PCI addresses, NUMA affinity, NVLinks, and for every pair
// of GPUs the path between them and whether they can read each other's
// memory (P2P). slimerun --print-topology shows it; the CUDA backend asks
// [Topology.P2P] before it maps a peer's memory with CUDA IPC.
package topology

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// ErrNoNVML: NVML could not be used (no driver, or no cgo in this build).
var ErrNoNVML = errors.New("topology: NVML unavailable")

// GPU is one device as NVML sees it.
type GPU struct {
	Index   int
	Name    string
	UUID    string
	BusID   string // "00000000:3B:00.0", as NVML spells it
	NUMA    int    // -1 when unknown
	NVLinks int    // active links
}

// Topology is what Read found.
type Topology struct {
	CPUs      int
	NUMANodes []string // e.g. "node0: cpus 0-31"
	Driver    string
	GPUs      []GPU
	// Path[i][j] is the connection between GPUs i and j in nvidia-smi's
	// words: X (itself), NV<n> (n NVLinks), PIX, PXB, PHB, NODE, SYS.
	Path [][]string
	// P2PRead[i][j] says whether GPU i can read GPU j's memory directly.
	P2PRead [][]bool
	// NVMLErr says why there are no GPUs, when NVML could not be used.
	NVMLErr error
}

// Read describes this machine. It fails only for want of /sys; missing
// NVML is reported in NVMLErr, with no GPUs.
func Read() (*Topology, error) {
	t := &Topology{CPUs: runtime.NumCPU()}
	nodes, _ := filepath.Glob("/sys/devices/system/node/node[0-9]*")
	for _, n := range nodes {
		cpus, err := os.ReadFile(filepath.Join(n, "cpulist"))
		if err != nil {
			continue
		}
		t.NUMANodes = append(t.NUMANodes, fmt.Sprintf("%s: cpus %s", filepath.Base(n), strings.TrimSpace(string(cpus))))
	}
	t.NVMLErr = readGPUs(t)
	return t, nil
}

// P2P says whether every pair of the GPUs with these PCI addresses can read
// each other's memory (true for one GPU, or several ranks on one GPU).
// Addresses NVML does not list count as unknown, and unknown is true: the
// caller's CUDA IPC mapping then decides.
func (t *Topology) P2P(busIDs []string) bool {
	idx := make([]int, len(busIDs))
	for k, b := range busIDs {
		idx[k] = -1
		for i, g := range t.GPUs {
			if sameBus(g.BusID, b) {
				idx[k] = i
			}
		}
	}
	for _, a := range idx {
		for _, b := range idx {
			if a >= 0 && b >= 0 && a != b && !t.P2PRead[a][b] {
				return false
			}
		}
	}
	return true
}

// sameBus compares PCI addresses that CUDA ("0000:3b:00.0") and NVML
// ("00000000:3B:00.0") spell differently.
func sameBus(a, b string) bool {
	norm := func(s string) string {
		s = strings.ToLower(s)
		if i := strings.Index(s, ":"); i >= 0 {
			dom := strings.TrimLeft(s[:i], "0")
			s = dom + s[i:]
		}
		return s
	}
	return norm(a) == norm(b)
}

// Write prints the topology for people, GPUs as a matrix like nvidia-smi
// topo -m.
func (t *Topology) Write(w io.Writer) {
	fmt.Fprintf(w, "CPUs: %d\n", t.CPUs)
	for _, n := range t.NUMANodes {
		fmt.Fprintf(w, "  NUMA %s\n", n)
	}
	if t.NVMLErr != nil {
		fmt.Fprintf(w, "GPUs: none found (%v)\n", t.NVMLErr)
		return
	}
	fmt.Fprintf(w, "GPUs: %d (driver %s)\n", len(t.GPUs), t.Driver)
	for _, g := range t.GPUs {
		numa := "?"
		if g.NUMA >= 0 {
			numa = fmt.Sprint(g.NUMA)
		}
		fmt.Fprintf(w, "  GPU%d %s %s NUMA %s NVLinks %d %s\n", g.Index, g.Name, g.BusID, numa, g.NVLinks, g.UUID)
	}
	if len(t.GPUs) < 2 {
		return
	}
	fmt.Fprintf(w, "%8s", "")
	for i := range t.GPUs {
		fmt.Fprintf(w, " %6s", fmt.Sprintf("GPU%d", i))
	}
	fmt.Fprintln(w)
	for i := range t.GPUs {
		fmt.Fprintf(w, "%8s", fmt.Sprintf("GPU%d", i))
		for j := range t.GPUs {
			cell := t.Path[i][j]
			if i != j && !t.P2PRead[i][j] {
				cell += "*"
			}
			fmt.Fprintf(w, " %6s", cell)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "  X itself, NV<n> n NVLinks, PIX/PXB PCIe switch(es), PHB host bridge, NODE within a NUMA node, SYS across; * no P2P read")
}
