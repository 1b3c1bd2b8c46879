package cpustat

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"time"
)

// userHZ is the unit of /proc/stat's times: USER_HZ, 100 on every Linux
// architecture Go runs on.
const userHZ = 100

// now reads /proc/stat: the aggregate line's idle and iowait fields, and
// one cpuN line per online processor.
func now() (Sample, bool) {
	b, err := os.ReadFile("/proc/stat")
	at := time.Now()
	if err != nil {
		return Sample{}, false
	}
	s := Sample{at: at}
	found := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) == 0 || !bytes.HasPrefix(f[0], []byte("cpu")) {
			continue
		}
		if len(f[0]) > 3 {
			s.cpus++
			continue
		}
		if len(f) < 6 {
			return Sample{}, false
		}
		var ticks int64
		for _, x := range f[4:6] { // idle, iowait
			v, err := strconv.ParseInt(string(x), 10, 64)
			if err != nil {
				return Sample{}, false
			}
			ticks += v
		}
		s.idle = time.Duration(ticks) * (time.Second / userHZ)
		found = true
	}
	return s, found && s.cpus > 0
}
