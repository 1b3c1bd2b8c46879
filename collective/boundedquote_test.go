package collective

import (
	"strings"
	"testing"
)

// TestStoreValuesQuotedBounded: a layout or call read from the store that
// does not parse is quoted in the error cut short, whatever its size.
func TestStoreValuesQuotedBounded(t *testing.T) {
	junk := strings.Repeat("x", 64<<10)
	for _, in := range []string{junk, "0 1 2 " + junk, "a b c d e " + junk} {
		if _, err := parseWhere([]byte(in)); err == nil || len(err.Error()) > 512 {
			t.Errorf("parseWhere of %d bytes: an error of %d bytes", len(in), len(err.Error()))
		}
	}
}
