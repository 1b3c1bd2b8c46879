package launcher

import (
	"strings"
	"testing"
)

// TestStoreValuesQuotedBounded: a value read from the store that does
// not parse is quoted in the error cut short, whatever its size (a
// store value may be a MiB).
func TestStoreValuesQuotedBounded(t *testing.T) {
	junk := strings.Repeat("x", 64<<10)
	for _, tc := range []struct {
		what string
		err  func() error
	}{
		{"placement", func() error { _, _, err := parsePlacement([]byte(junk)); return err }},
		{"node record", func() error { _, err := parseNodeInfo([]byte(junk)); return err }},
		{"node record field", func() error { _, err := parseNodeInfo([]byte("nnodes=" + junk)); return err }},
	} {
		err := tc.err()
		if err == nil || len(err.Error()) > 512 {
			t.Errorf("%s: an error of %d bytes", tc.what, len(err.Error()))
		}
	}
}
