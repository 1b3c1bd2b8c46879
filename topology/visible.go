package topology

import (
	"os"
	"strconv"
	"strings"
)

// VisibleGPUs is how many GPUs CUDA shows this process: those NVML finds,
// narrowed by CUDA_VISIBLE_DEVICES as CUDA narrows them (Visible). It is
// for a launcher that counts GPUs (slimerun --nproc-per-node gpu) where
// no CUDA library of slimego's is installed: an unmodified PyTorch
// program needs none.
func VisibleGPUs() (int, error) {
	t := &Topology{}
	if err := readGPUs(t); err != nil {
		return 0, err
	}
	v, set := os.LookupEnv("CUDA_VISIBLE_DEVICES")
	if !set {
		return len(t.GPUs), nil
	}
	uuids := make([]string, len(t.GPUs))
	for i, g := range t.GPUs {
		uuids[i] = g.UUID
	}
	return Visible(v, uuids), nil
}

// Visible is how many of the GPUs whose UUIDs are given a
// CUDA_VISIBLE_DEVICES of v shows, by CUDA's rule: its entries are read
// in order up to the first that names no GPU, or one named before (so
// "", "-1" or "none" shows none, and "0,7,1" on four GPUs shows one). An
// entry is an index, a GPU's UUID ("GPU-…") or a unique prefix of one,
// or a MIG instance ("MIG-…", one device each, which NVML's device list
// does not hold to check).
func Visible(v string, uuids []string) int {
	seen := make(map[int]bool, len(uuids))
	n := 0
	for e := range strings.SplitSeq(v, ",") {
		e = strings.TrimSpace(e)
		idx := -1
		switch {
		case strings.HasPrefix(e, "MIG-") && len(e) > len("MIG-"):
			n++
			continue
		case strings.HasPrefix(e, "GPU-") && len(e) > len("GPU-"):
			for i, u := range uuids {
				if strings.HasPrefix(u, e) {
					if idx >= 0 {
						idx = -1 // not unique
						break
					}
					idx = i
				}
			}
		default:
			if i, err := strconv.Atoi(e); err == nil && i >= 0 && i < len(uuids) {
				idx = i
			}
		}
		if idx < 0 || seen[idx] {
			break
		}
		seen[idx] = true
		n++
	}
	return n
}
