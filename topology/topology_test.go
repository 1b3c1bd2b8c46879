package topology

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestReadHere(t *testing.T) {
	top, err := Read()
	if err != nil {
		t.Fatal(err)
	}
	if top.CPUs < 1 {
		t.Errorf("CPUs = %d", top.CPUs)
	}
	var b bytes.Buffer
	top.Write(&b)
	if !strings.Contains(b.String(), "CPUs:") || !strings.Contains(b.String(), "GPUs:") {
		t.Errorf("report:\n%s", b.String())
	}
	if top.NVMLErr != nil {
		if !errors.Is(top.NVMLErr, ErrNoNVML) || len(top.GPUs) != 0 {
			t.Errorf("without NVML: %v, %d GPUs", top.NVMLErr, len(top.GPUs))
		}
		t.Logf("no NVML here: %v", top.NVMLErr)
		return
	}
	if len(top.GPUs) == 0 {
		t.Error("NVML works but lists no GPU")
	}
	t.Logf("\n%s", b.String())
}

func TestP2PAndBusSpelling(t *testing.T) {
	top := &Topology{
		GPUs:    []GPU{{BusID: "00000000:3B:00.0"}, {BusID: "00000000:5E:00.0"}, {BusID: "00000000:86:00.0"}},
		P2PRead: [][]bool{{true, true, false}, {true, true, true}, {false, true, true}},
	}
	cases := []struct {
		bus  []string
		want bool
	}{
		{[]string{"0000:3b:00.0"}, true},
		{[]string{"0000:3b:00.0", "0000:3b:00.0"}, true}, // ranks sharing a GPU
		{[]string{"0000:3b:00.0", "0000:5e:00.0"}, true},
		{[]string{"0000:3b:00.0", "0000:86:00.0"}, false},
		{[]string{"0000:5e:00.0", "0000:86:00.0", "0000:99:00.0"}, true}, // unknown: IPC decides
	}
	for _, c := range cases {
		if got := top.P2P(c.bus); got != c.want {
			t.Errorf("P2P(%v) = %v, want %v", c.bus, got, c.want)
		}
	}
}
