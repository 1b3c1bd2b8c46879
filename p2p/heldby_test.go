package p2p

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

// procLine is a line of /proc/net/tcp (tcp6 where six), as the kernel
// prints it, for a socket from lo to re with inode ino.
func procLine(sl int, lo, re netip.AddrPort, six bool, ino uint64) string {
	addr := func(a netip.AddrPort) string {
		var s strings.Builder
		if six {
			b := a.Addr().As16() // a v4 address as the kernel shows a dual-stack socket's: mapped
			for i := 0; i < 16; i += 4 {
				fmt.Fprintf(&s, "%08X", binary.NativeEndian.Uint32(b[i:]))
			}
		} else {
			b := a.Addr().As4()
			fmt.Fprintf(&s, "%08X", binary.NativeEndian.Uint32(b[:]))
		}
		fmt.Fprintf(&s, ":%04X", a.Port())
		return s.String()
	}
	return fmt.Sprintf("%4d: %s %s 01 00000000:00000000 00:00000000 00000000  1000        0 %d 1 0000000000000000 20 4 30 10 -1\n",
		sl, addr(lo), addr(re), ino)
}

const procHeader = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"

// fieldsInodes is tableInodes as heldBy first did it (every line split
// with strings.Fields and parsed): the oracle of TestTableInodesAgrees.
func fieldsInodes(b []byte, want map[sockEnds]bool, inodes map[string]bool) {
	for i, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if i == 0 || len(f) < 10 {
			continue
		}
		lo, err1 := procAddr(f[1])
		re, err2 := procAddr(f[2])
		if err1 == nil && err2 == nil && want[sockEnds{lo, re}] && f[9] != "0" {
			inodes["socket:["+f[9]+"]"] = true
		}
	}
}

// TestTableInodes: tableInodes finds a wanted socket's inode in a tcp or
// tcp6 table, a dual-stack socket's mapped address too, and nothing for
// a socket whose other end differs, a time-wait socket (inode 0), a line
// cut short, or the header.
func TestTableInodes(t *testing.T) {
	ap := netip.MustParseAddrPort
	lo, re := ap("127.0.0.1:40000"), ap("127.0.0.1:5000")
	lo6, re6 := ap("[fd00::1]:40001"), ap("[fd00::2]:5001")
	want := map[sockEnds]bool{{lo, re}: true, {lo6, re6}: true}
	full := procLine(0, lo, re, false, 111)
	for _, tc := range []struct {
		name  string
		table string
		want  []string
	}{
		{"tcp", procHeader + procLine(0, ap("10.0.0.1:40000"), re, false, 7) + full, []string{"socket:[111]"}},
		{"tcp6", procHeader + procLine(0, lo6, re6, true, 222), []string{"socket:[222]"}},
		{"tcp6, dual-stack", procHeader + procLine(3, lo, re, true, 333), []string{"socket:[333]"}},
		{"both", procHeader + full + procLine(1, lo6, re6, true, 222), []string{"socket:[111]", "socket:[222]"}},
		{"another remote", procHeader + procLine(0, lo, ap("127.0.0.1:5002"), false, 9), nil},
		{"reversed", procHeader + procLine(0, re, lo, false, 9), nil},
		{"time-wait", procHeader + procLine(0, lo, re, false, 0), nil},
		{"no newline at the end", procHeader + strings.TrimSuffix(full, "\n"), []string{"socket:[111]"}},
		{"cut short", procHeader + full[:len(full)/2], nil},
		{"the header alone", strings.Replace(full, "\n", "", 1), nil},
		{"empty", "", nil},
		{"lower-case hex", procHeader + strings.ToLower(full), []string{"socket:[111]"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := map[string]bool{}
			tableInodes([]byte(tc.table), want, got)
			wantSet := map[string]bool{}
			for _, s := range tc.want {
				wantSet[s] = true
			}
			if !reflect.DeepEqual(got, wantSet) {
				t.Errorf("got %v, want %v", got, wantSet)
			}
		})
	}
}

// TestTableInodesAgrees: on tables as the kernel prints them, of sockets
// among a few addresses and ports (so that many lines share a wanted
// port), tableInodes finds what splitting every line finds.
func TestTableInodesAgrees(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	addrs := []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("fd00::7")}
	pick := func() netip.AddrPort {
		return netip.AddrPortFrom(addrs[r.IntN(len(addrs))], uint16(5000+r.IntN(4)))
	}
	for round := range 200 {
		want := map[sockEnds]bool{}
		for range 1 + r.IntN(4) {
			want[sockEnds{pick(), pick()}] = true
		}
		var b strings.Builder
		b.WriteString(procHeader)
		for i := range r.IntN(300) {
			lo, re := pick(), pick()
			if lo.Addr().Is4() != re.Addr().Is4() {
				continue // a socket's two ends are of one family
			}
			six := !lo.Addr().Is4() || r.IntN(2) == 0 // v4 in tcp6: a dual-stack socket
			b.WriteString(procLine(i, lo, re, six, uint64(r.IntN(3)*(1000+i))))
		}
		got, oracle := map[string]bool{}, map[string]bool{}
		tableInodes([]byte(b.String()), want, got)
		fieldsInodes([]byte(b.String()), want, oracle)
		if !reflect.DeepEqual(got, oracle) {
			t.Fatalf("round %d: tableInodes found %v, splitting every line %v\n%s", round, got, oracle, b.String())
		}
	}
}

// BenchmarkTableInodes: a table of 100000 sockets (a busy host's
// time-wait ones included), one of them wanted, walked in place
// (tableInodes) and split line by line (fieldsInodes, heldBy's first
// way).
func BenchmarkTableInodes(b *testing.B) {
	ap := netip.MustParseAddrPort
	lo, re := ap("127.0.0.1:40000"), ap("127.0.0.1:5000")
	var s strings.Builder
	s.WriteString(procHeader)
	for i := range 100000 {
		s.WriteString(procLine(i, netip.AddrPortFrom(lo.Addr(), uint16(20000+i%40000)), ap("127.0.0.1:8080"), false, 0))
	}
	s.WriteString(procLine(100000, lo, re, false, 12345))
	table := []byte(s.String())
	want := map[sockEnds]bool{{lo, re}: true}
	for _, bc := range []struct {
		name string
		f    func([]byte, map[sockEnds]bool, map[string]bool)
	}{{"in-place", tableInodes}, {"split", fieldsInodes}} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				got := map[string]bool{}
				bc.f(table, want, got)
				if !got["socket:[12345]"] {
					b.Fatal("the wanted socket was not found")
				}
			}
		})
	}
}
