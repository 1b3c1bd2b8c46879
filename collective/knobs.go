package collective

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/inter"
	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/intra"
	"github.com/slimego/slimego/kernels"
)

// The knobs that change how ranks talk to each other, and so must agree
// (where it is in the layout's scope): a rank published with another value
// would connect, frame or lay out its shared memory otherwise than its
// peers, which then wait for it until the timeout. Each rank publishes
// its own at Init beside its layout (knobs/RANK), and every rank checks
// everyone's, so that all fail at once with the same error. The others
// (timeouts, copy thresholds, polling, the socket's low-water mark, the
// interface) are each rank's own business.
const (
	knobWorldSize  = iota // WORLD_SIZE: every rank
	knobAlgo              // SLIME_ALGO, as each rank resolves it: every rank
	knobBackend           // SLIME_BACKEND, resolved: every rank
	knobChannels          // SLIME_CHANNELS: every rank, where TCP carries the all-gather
	knobSlotBytes         // SLIME_SLOT_BYTES: the node's ranks
	knobSlots             // SLIME_SLOTS: the node's ranks
	knobGPUScratch        // SLIME_GPU_SCRATCH: the node's ranks, on CUDA
	nKnobs
)

var knobNames = [nKnobs]string{"WORLD_SIZE", "SLIME_ALGO", "SLIME_BACKEND", "SLIME_CHANNELS", "SLIME_SLOT_BYTES", "SLIME_SLOTS", "SLIME_GPU_SCRATCH"}

// knobs is one rank's values, as published: strings without spaces.
type knobs [nKnobs]string

// myKnobs are this rank's values (defaults filled in where they do not
// depend on the layout) with kind the backend Init resolved.
func myKnobs(o Options, kind device.Kind) knobs {
	def := func(v, d int) string {
		if v <= 0 {
			v = d
		}
		return strconv.Itoa(v)
	}
	backend := kind.String()
	if kind == device.CUDA && o.Backend == device.Auto {
		backend += "/auto" // the CPU where a node has more ranks than the kernels take
	}
	return knobs{
		knobWorldSize:  strconv.Itoa(o.WorldSize),
		knobAlgo:       o.Algo,
		knobBackend:    backend,
		knobChannels:   def(o.Channels, inter.DefaultChannels),
		knobSlotBytes:  strconv.Itoa(intra.SlotBytes(o.SlotBytes)), // as the node's group rounds it
		knobSlots:      def(o.Slots, intra.DefaultSlots),
		knobGPUScratch: strconv.Itoa(max(o.GPUScratch, 0)),
	}
}

func (k knobs) String() string { return strings.Join(k[:], " ") }

// parseKnobs decodes an entry read from the store, which is not trusted.
func parseKnobs(v []byte) (knobs, error) {
	f := strings.Fields(string(v))
	if len(f) != nKnobs {
		return knobs{}, fmt.Errorf("%d fields, want %d", len(f), nKnobs)
	}
	var k knobs
	for i, s := range f {
		if len(s) > 64 {
			return knobs{}, fmt.Errorf("field %d is %d bytes long", i+1, len(s))
		}
		k[i] = s
	}
	return k, nil
}

// checkKnobs compares every rank's knobs (all) in the scope of each, in
// the order above, against the reference: rank 0 for the job's, the
// node's first rank for a node's. The first difference is ErrInvalid
// naming the knob, both ranks and both values, the same on every rank;
// its peer is the differing rank, or on that rank the reference.
func checkKnobs(me int, lay layout, all []knobs) error {
	nodeOf := make([]int, len(all))
	for n, m := range lay.members {
		for _, r := range m {
			nodeOf[r] = n
		}
	}
	// The algorithm and the backend compare as resolved (what the rank
	// will run): auto and the setting it resolves to agree. The message
	// shows the setting beside what it resolved to.
	algo := func(r int) (resolved, shown string) {
		var o Options
		o.Algo = all[r][knobAlgo]
		a, err := chooseAlgo(o, lay)
		if err != nil || a == all[r][knobAlgo] {
			return all[r][knobAlgo], all[r][knobAlgo]
		}
		return a, a + " (" + all[r][knobAlgo] + ")"
	}
	backend := func(r int) (resolved, shown string) {
		b, auto := strings.CutSuffix(all[r][knobBackend], "/auto")
		if auto && len(lay.members[nodeOf[r]]) > kernels.MaxLocal {
			return device.CPU.String(), device.CPU.String() + " (auto)"
		}
		return b, b
	}
	value := func(i, r int) (resolved, shown string) {
		switch i {
		case knobAlgo:
			return algo(r)
		case knobBackend:
			return backend(r)
		case knobGPUScratch:
			n, err := strconv.Atoi(all[r][i])
			if err != nil {
				return all[r][i], all[r][i]
			}
			v := strconv.Itoa(intra.GPUScratch(n, len(lay.members[nodeOf[r]])))
			return v, v
		}
		return all[r][i], all[r][i]
	}
	a0, _ := algo(0)
	b0, _ := backend(0)
	tcp := a0 == "ring" || len(lay.members) > 1
	cuda := b0 == device.CUDA.String()
	for i := range nKnobs {
		perNode := i == knobSlotBytes || i == knobSlots || i == knobGPUScratch
		if i == knobChannels && !tcp || i == knobGPUScratch && !cuda {
			continue
		}
		for r := range all {
			ref := 0
			if perNode {
				ref = lay.members[nodeOf[r]][0]
			}
			a, as := value(i, ref)
			b, bs := value(i, r)
			if a == b {
				continue
			}
			where := ""
			if perNode {
				where = " on node " + strconv.Itoa(nodeOf[r])
			}
			peer := r
			if me == r {
				peer = ref
			}
			return fault.New("init", me, peer, ErrInvalid, "%s differs%s: rank %d has %s, rank %d has %s (every rank needs the same)", knobNames[i], where, ref, as, r, bs)
		}
	}
	return nil
}
