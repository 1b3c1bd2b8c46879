package topology

import "testing"

func TestVisible(t *testing.T) {
	uuids := []string{"GPU-aaaa-1", "GPU-bbbb-2", "GPU-bbbc-3", "GPU-dddd-4"}
	for _, tc := range []struct {
		v    string
		want int
	}{
		{"", 0},
		{"-1", 0},
		{"none", 0},
		{"0", 1},
		{"0,1,2,3", 4},
		{"3, 1", 2},
		{"0,7,1", 1},     // stops at the first that names no GPU
		{"1,1,2", 1},     // or one named before
		{"0,,1", 1},      // an empty entry names none
		{"GPU-aaaa", 1},  // a unique prefix
		{"GPU-bbb,0", 0}, // a prefix of two
		{"GPU-dddd-4,GPU-bbbc,0", 3},
		{"2,GPU-bbbc-3", 1}, // the same GPU twice
		{"MIG-x,MIG-y", 2},
		{"4", 0},
	} {
		if got := Visible(tc.v, uuids); got != tc.want {
			t.Errorf("Visible(%q) = %d, want %d", tc.v, got, tc.want)
		}
	}
}
