package p2p

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"strings"
	"unicode/utf8"

	"github.com/slimego/slimego/inter"
)

// An endpoint's Info, as Publish puts it in the store and ConnectInfo takes
// it:
//
//	"SLP2" u8 version
//	u8 len, name          the endpoint's name
//	u8 len, address       its listener, a literal ip:port
//	u8 len, host          boot id and pid namespace: equal means same host
//	u32 pid
//	u64 token, u64 its address: a peer on the same host that reads the
//	    token there with process_vm_readv may copy with it
//	u16 regions, then each: u8 len, name, u64 id, u64 key, u64 size
const (
	infoMagic   = "SLP2"
	infoVersion = 1
	// MaxInfoRegions bounds the regions an Info lists: the first
	// registered (the rest are handed over with Region.Remote).
	MaxInfoRegions = 1024
)

type info struct {
	name, addr, host string
	pid              uint32
	token, tokenAddr uint64
	regions          []RemoteRegion
}

func (in *info) encode() []byte {
	b := append([]byte(infoMagic), infoVersion)
	str := func(s string) { b = append(b, byte(len(s))); b = append(b, s...) }
	str(in.name)
	str(in.addr)
	str(in.host)
	b = binary.LittleEndian.AppendUint32(b, in.pid)
	b = binary.LittleEndian.AppendUint64(b, in.token)
	b = binary.LittleEndian.AppendUint64(b, in.tokenAddr)
	n := min(len(in.regions), MaxInfoRegions)
	b = binary.LittleEndian.AppendUint16(b, uint16(n))
	for _, r := range in.regions[:n] {
		str(r.Name)
		b = binary.LittleEndian.AppendUint64(b, r.ID)
		b = binary.LittleEndian.AppendUint64(b, r.Key)
		b = binary.LittleEndian.AppendUint64(b, r.Size)
	}
	return b
}

// decodeInfo parses an Info strictly: every length in bounds, names valid
// UTF-8 without NUL, the address a literal ip:port, nothing left over.
func decodeInfo(b []byte) (info, error) {
	var in info
	bad := func(what string) (info, error) { return info{}, fmt.Errorf("%w: endpoint info: %s", ErrInvalid, what) }
	if len(b) < len(infoMagic)+1 || string(b[:len(infoMagic)]) != infoMagic {
		return bad("not an endpoint's info")
	}
	if b[len(infoMagic)] != infoVersion {
		return bad(fmt.Sprintf("version %d, want %d", b[len(infoMagic)], infoVersion))
	}
	b = b[len(infoMagic)+1:]
	str := func(max int) (string, bool) {
		if len(b) < 1 || int(b[0]) > len(b)-1 || int(b[0]) > max {
			return "", false
		}
		s := string(b[1 : 1+int(b[0])])
		b = b[1+int(b[0]):]
		return s, utf8.ValidString(s) && !strings.ContainsRune(s, 0)
	}
	var ok bool
	if in.name, ok = str(MaxName); !ok || in.name == "" || validName(in.name) != nil {
		return bad("name")
	}
	if in.addr, ok = str(64); !ok {
		return bad("address")
	}
	if _, err := inter.ParseAddr(in.addr); err != nil {
		return bad(err.Error())
	}
	if in.host, ok = str(128); !ok {
		return bad("host")
	}
	if len(b) < 22 {
		return bad("truncated")
	}
	in.pid = binary.LittleEndian.Uint32(b)
	in.token = binary.LittleEndian.Uint64(b[4:])
	in.tokenAddr = binary.LittleEndian.Uint64(b[12:])
	n := int(binary.LittleEndian.Uint16(b[20:]))
	b = b[22:]
	if n > MaxInfoRegions {
		return bad("too many regions")
	}
	for range n {
		var r RemoteRegion
		if r.Name, ok = str(MaxName); !ok || validName(r.Name) != nil || len(b) < 24 {
			return bad("region")
		}
		r.ID, r.Key, r.Size = binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[8:]), binary.LittleEndian.Uint64(b[16:])
		if r.Size == 0 || r.Size > MaxLen {
			return bad("region size")
		}
		b = b[24:]
		in.regions = append(in.regions, r)
	}
	if len(b) != 0 {
		return bad("trailing bytes")
	}
	return in, nil
}

// validName checks a name: valid UTF-8, no NUL or '/', at most MaxName
// bytes.
func validName(s string) error {
	if len(s) > MaxName || !utf8.ValidString(s) {
		return fmt.Errorf("%w: name %.32q: at most %d bytes of UTF-8", ErrInvalid, s, MaxName)
	}
	for _, c := range s {
		if c == 0 || c == '/' {
			return fmt.Errorf("%w: name %.32q holds NUL or '/'", ErrInvalid, s)
		}
	}
	return nil
}

// clip is s cut to at most n bytes, "..." marking a cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// nameTag is the tag of an endpoint's name that its answer to a hello
// carries (the header's id, never 0), so that a connector finds out when
// the address it dialed is another endpoint's than the Info's name.
func nameTag(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return h.Sum64() | 1
}
