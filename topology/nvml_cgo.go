//go:build cgo && linux

package topology

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func readGPUs(t *Topology) error {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return fmt.Errorf("%w: %v", ErrNoNVML, nvml.ErrorString(ret))
	}
	defer nvml.Shutdown()
	if v, ret := nvml.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		t.Driver = v
	}
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("%w: device count: %v", ErrNoNVML, nvml.ErrorString(ret))
	}
	devs := make([]nvml.Device, n)
	for i := range n {
		d, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("%w: device %d: %v", ErrNoNVML, i, nvml.ErrorString(ret))
		}
		devs[i] = d
		g := GPU{Index: i, NUMA: -1}
		g.Name, _ = d.GetName()
		g.UUID, _ = d.GetUUID()
		if pci, ret := d.GetPciInfo(); ret == nvml.SUCCESS {
			g.BusID = busString(pci.BusIdLegacy[:])
			if id := busString(pci.BusId[:]); id != "" {
				g.BusID = id
			}
		}
		if numa, ret := d.GetNumaNodeId(); ret == nvml.SUCCESS {
			g.NUMA = numa
		}
		for l := 0; l < nvml.NVLINK_MAX_LINKS; l++ {
			if st, ret := d.GetNvLinkState(l); ret == nvml.SUCCESS && st == nvml.FEATURE_ENABLED {
				g.NVLinks++
			}
		}
		t.GPUs = append(t.GPUs, g)
	}
	t.Path = make([][]string, n)
	t.P2PRead = make([][]bool, n)
	for i := range n {
		t.Path[i] = make([]string, n)
		t.P2PRead[i] = make([]bool, n)
		for j := range n {
			if i == j {
				t.Path[i][j], t.P2PRead[i][j] = "X", true
				continue
			}
			t.Path[i][j] = pathName(devs[i], devs[j], t.GPUs[j].BusID)
			st, ret := devs[i].GetP2PStatus(devs[j], nvml.P2P_CAPS_INDEX_READ)
			t.P2PRead[i][j] = ret == nvml.SUCCESS && st == nvml.P2P_STATUS_OK
		}
	}
	return nil
}

// pathName counts the NVLinks from a to the GPU at bus b, else names the
// PCIe level of their common ancestor.
func pathName(a, b nvml.Device, bus string) string {
	links := 0
	for l := 0; l < nvml.NVLINK_MAX_LINKS; l++ {
		if st, ret := a.GetNvLinkState(l); ret != nvml.SUCCESS || st != nvml.FEATURE_ENABLED {
			continue
		}
		if pci, ret := a.GetNvLinkRemotePciInfo(l); ret == nvml.SUCCESS && sameBus(busString(pci.BusId[:]), bus) {
			links++
		}
	}
	if links > 0 {
		return fmt.Sprintf("NV%d", links)
	}
	lvl, ret := a.GetTopologyCommonAncestor(b)
	if ret != nvml.SUCCESS {
		return "?"
	}
	switch lvl {
	case nvml.TOPOLOGY_INTERNAL:
		return "X"
	case nvml.TOPOLOGY_SINGLE:
		return "PIX"
	case nvml.TOPOLOGY_MULTIPLE:
		return "PXB"
	case nvml.TOPOLOGY_HOSTBRIDGE:
		return "PHB"
	case nvml.TOPOLOGY_NODE:
		return "NODE"
	}
	return "SYS"
}

func busString[T ~int8 | ~uint8](b []T) string {
	s := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}
