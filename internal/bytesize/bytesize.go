// Package bytesize reads and writes byte counts with binary suffixes
// ("64M", "4K", "1G"), as the CLIs and SLIME_* variables take them.
package bytesize

import (
	"fmt"
	"strconv"
	"strings"
)

// Parse reads a byte count: digits with an optional K, M or G suffix
// (powers of 1024), optionally followed by B or iB.
func Parse(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "IB"), "B")
	mult := int64(1)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		}
		if mult > 1 {
			t = t[:n-1]
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("bytesize: %q is not a byte count (want e.g. 8, 4K, 64M, 1G)", s)
	}
	return n * mult, nil
}

// Format writes n the way Parse reads it, with the largest suffix that
// divides it exactly.
func Format(n int64) string {
	for _, u := range []struct {
		suf  string
		size int64
	}{{"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}} {
		if n >= u.size && n%u.size == 0 {
			return strconv.FormatInt(n/u.size, 10) + u.suf
		}
	}
	return strconv.FormatInt(n, 10)
}
