package bytesize

import "testing"

func TestParse(t *testing.T) {
	cases := map[string]int64{"0": 0, "8": 8, "8B": 8, "4K": 4096, "4k": 4096, "64M": 64 << 20, "64MiB": 64 << 20, "1G": 1 << 30, " 3 ": 3}
	for in, want := range cases {
		if got, err := Parse(in); err != nil || got != want {
			t.Errorf("Parse(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "K", "-1", "1.5M", "12X", "99999999999G"} {
		if _, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) accepted", in)
		}
	}
}

func TestFormatRoundTrip(t *testing.T) {
	for _, n := range []int64{0, 1, 7, 1000, 4096, 1<<20 + 3, 64 << 20, 3 << 30} {
		if got, err := Parse(Format(n)); err != nil || got != n {
			t.Errorf("Parse(Format(%d)) = %d, %v", n, got, err)
		}
	}
	if Format(64<<20) != "64M" {
		t.Errorf("Format(64M) = %s", Format(64<<20))
	}
}
