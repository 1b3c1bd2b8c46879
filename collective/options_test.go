package collective

import (
	"github.com/slimego/slimego/device"
	"reflect"
	"testing"
)

// Every knob of Options outside Job (which the launcher's variables fill,
// TestLoadEnv) is settable from its SLIME_* variable: each variable set
// alone changes its field, and every field of Shm, TCP and CUDA, and the
// top-level Timeout, Backend and Debug, has a row here, so that a knob
// added without a variable fails.
func TestEveryKnobFromEnv(t *testing.T) {
	knobs := []struct{ field, env, value string }{
		{"Timeout", "SLIME_TIMEOUT", "90s"},
		{"Backend", "SLIME_BACKEND", "cpu"},
		{"Debug", "SLIME_DEBUG", "INFO"},
		{"SpinTime", "SLIME_SPIN", "3ms"},
		{"SlotBytes", "SLIME_SLOT_BYTES", "128K"},
		{"Slots", "SLIME_SLOTS", "8"},
		{"ZeroCopyMin", "SLIME_ZERO_COPY_MIN", "64K"},
		{"CMAMin", "SLIME_CMA_MIN", "1M"},
		{"BigCopy", "SLIME_BIG_COPY", "2M"},
		{"Algo", "SLIME_ALGO", "ring"},
		{"SocketIfName", "SLIME_SOCKET_IFNAME", "lo"},
		{"Channels", "SLIME_CHANNELS", "3"},
		{"RcvLowat", "SLIME_RCVLOWAT", "1M"},
		{"SendCopyMin", "SLIME_SEND_COPY_MIN", "8M"},
		{"Eager", "SLIME_EAGER", "1"},
		{"GPUScratch", "SLIME_GPU_SCRATCH", "4M"},
		{"GPUBlocks", "SLIME_GPU_BLOCKS", "64"},
	}
	base, err := LoadEnv(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	covered := map[string]bool{}
	for _, k := range knobs {
		covered[k.field] = true
		got, err := LoadEnv(func(name string) string {
			if name == k.env {
				return k.value
			}
			return ""
		})
		if err != nil {
			t.Errorf("%s=%s: %v", k.env, k.value, err)
			continue
		}
		f, b := reflect.ValueOf(got).FieldByName(k.field), reflect.ValueOf(base).FieldByName(k.field)
		if !f.IsValid() {
			t.Errorf("Options has no field %s", k.field)
			continue
		}
		if f.IsZero() || reflect.DeepEqual(f.Interface(), b.Interface()) {
			t.Errorf("%s=%s left Options.%s at %v", k.env, k.value, k.field, f.Interface())
		}
	}
	ot := reflect.TypeFor[Options]()
	for i := range ot.NumField() {
		sf := ot.Field(i)
		if sf.Name == "Job" {
			continue
		}
		if !sf.Anonymous {
			if !covered[sf.Name] {
				t.Errorf("Options.%s has no SLIME_* row in this test", sf.Name)
			}
			continue
		}
		for j := range sf.Type.NumField() {
			if n := sf.Type.Field(j).Name; !covered[n] {
				t.Errorf("Options.%s.%s has no SLIME_* row in this test", sf.Name, n)
			}
		}
	}
}

// TestPollMax: a node's ranks poll their sockets (the transport's default
// bound) unless they outnumber its cores, where they never poll.
func TestPollMax(t *testing.T) {
	if got := pollMax(false); got != 0 {
		t.Errorf("not oversubscribed: PollMax %v, want 0 (the default)", got)
	}
	if got := pollMax(true); got != -1 {
		t.Errorf("oversubscribed: PollMax %v, want -1 (never)", got)
	}
}

// Slot sizes that intra rounds to the same one lay out shared memory
// alike, so they agree: 65 and 128 bytes are both two cache lines.
func TestKnobsSlotBytesAsResolved(t *testing.T) {
	a, b := myKnobs(Options{Shm: Shm{SlotBytes: 65}}, device.CPU), myKnobs(Options{Shm: Shm{SlotBytes: 128}}, device.CPU)
	if a[knobSlotBytes] != b[knobSlotBytes] {
		t.Errorf("SLIME_SLOT_BYTES 65 publishes %q, 128 %q: the same layout would be a mismatch", a[knobSlotBytes], b[knobSlotBytes])
	}
	if c := myKnobs(Options{Shm: Shm{SlotBytes: 192}}, device.CPU); c[knobSlotBytes] == b[knobSlotBytes] {
		t.Errorf("192 and 128 publish the same %q", c[knobSlotBytes])
	}
}
