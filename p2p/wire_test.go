package p2p

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/kernels"
)

func hdr(h header) []byte {
	b := make([]byte, HeaderSize)
	h.put(b)
	return b
}

// FuzzDecodeHeader: the header decoder never panics, and what it accepts
// encodes back to the same bytes, within the bounds it promises.
func FuzzDecodeHeader(f *testing.F) {
	for _, h := range []header{
		{kind: kHello, id: 5, a: 1, b: 4, payload: helloFixed + 3},
		{kind: kHelloAck, status: stDup},
		{kind: kReq, sub: rRead, id: 1, a: 100, b: 2, payload: stripeSize + 2*DescSize},
		{kind: kReq, sub: rRead, ch: MaxChannels - 1, id: 2, a: 100, b: 2, payload: stripeSize + 2*DescSize},
		{kind: kReq, sub: rWriteV, id: 1, a: 100, b: 1, payload: stripeSize + DescSize},
		{kind: kReq, sub: rImm, id: 9, a: 0xffffffff},
		{kind: kReq, sub: rWriteImm, id: 1, a: 100, b: 2, payload: stripeSize + 2*DescSize + immSize},
		{kind: kReq, sub: rWriteImm, id: 1, a: 1 << 30, b: MaxBatch, payload: stripeSize + MaxBatch*DescSize + immSize},
		{kind: kReq, sub: rCTS, id: 9, status: stCancelled},
		{kind: kReq, sub: rSend, id: 9, status: stCancelled},
		{kind: kData, id: 3, payload: ChunkMax},
		{kind: kEnd, id: 3, status: stNoRegion},
		{kind: kResp, sub: rRead, id: 3, a: 77},
		{kind: kResp, sub: rReadV, id: 3, b: 2, payload: 2 * IovSize},
		{kind: kRelease, id: 3},
		{kind: kCancel, id: 3},
		{kind: kRevoke, id: 3},
		{kind: kReq, sub: rLease, id: 4, a: 4096, b: 1, payload: stripeSize + DescSize},
		{kind: kResp, sub: rLease, id: 4, b: 1, payload: IovSize},
		{kind: kResp, sub: rLease, id: 4, status: stNotHost},
		{kind: kReq, sub: rReadG, id: 5, a: 100, b: 1, payload: stripeSize + DescSize},
		{kind: kResp, sub: rWriteG, id: 5, b: 2, payload: 2 * IPCRecSize},
		{kind: kResp, sub: rReadG, id: 5, status: stNotHost},
		{kind: kReq, sub: rLeaseG, id: 6, a: 4096, b: 1, payload: stripeSize + DescSize},
		{kind: kResp, sub: rLeaseG, id: 6, b: 1, payload: IPCRecSize},
		{kind: kPing},
	} {
		f.Add(hdr(h))
	}
	f.Add(make([]byte, HeaderSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := decodeHeader(b)
		if err != nil {
			if !errors.Is(err, ErrFrame) {
				t.Fatalf("an error that is not ErrFrame: %v", err)
			}
			return
		}
		if !bytes.Equal(hdr(h), b[:HeaderSize]) {
			t.Fatalf("%+v does not encode back to %x", h, b[:HeaderSize])
		}
		switch {
		case h.kind == kData && (h.payload == 0 || h.payload > ChunkMax),
			h.kind == kReq && h.payload > stripeSize+MaxBatch*DescSize+immSize,
			h.kind == kReq && h.sub != rWriteImm && h.payload > stripeSize+MaxBatch*DescSize,
			h.kind == kResp && h.payload > MaxBatch*IPCRecSize,
			h.kind == kResp && h.payload > MaxBatch*IovSize && h.sub != rReadG && h.sub != rWriteG,
			h.kind == kResp && h.payload != 0 && h.payload != h.b*IovSize && h.payload != h.b*IPCRecSize,
			h.kind == kHello && (h.payload <= helloFixed || h.payload > helloFixed+MaxName),
			h.kind != kData && h.kind != kReq && h.kind != kResp && h.kind != kHello && h.payload != 0,
			h.a > MaxLen && !(h.kind == kHello),
			(h.sub == rLease || h.sub == rLeaseG) && h.b > 1,
			h.ch >= MaxChannels,
			h.ch != 0 && (h.kind != kReq || h.sub != rRead):
			t.Fatalf("accepted out of bounds: %+v", h)
		}
	})
}

// TestDecodeAnswerConnection: only a read request names the connection
// of its answer, and one of at most MaxChannels; every other frame has
// zero there.
func TestDecodeAnswerConnection(t *testing.T) {
	read := func(ch uint16) header {
		return header{kind: kReq, sub: rRead, ch: ch, id: 1, a: 100, b: 1, payload: stripeSize + DescSize}
	}
	for _, tc := range []struct {
		h  header
		ok bool
	}{
		{read(0), true},
		{read(1), true},
		{read(MaxChannels - 1), true},
		{read(MaxChannels), false},
		{read(0xffff), false},
		{header{kind: kReq, sub: rWrite, ch: 1, id: 1, a: 100, b: 1, payload: stripeSize + DescSize}, false},
		{header{kind: kReq, sub: rReadV, ch: 1, id: 1, a: 100, b: 1, payload: stripeSize + DescSize}, false},
		{header{kind: kResp, sub: rRead, ch: 1, id: 1, a: 100}, false},
		{header{kind: kData, ch: 1, id: 1, payload: 10}, false},
		{header{kind: kCancel, ch: 1, id: 1}, false},
		{header{kind: kPing, ch: 1}, false},
	} {
		h, err := decodeHeader(hdr(tc.h))
		if tc.ok && (err != nil || h != tc.h) {
			t.Errorf("%+v: decoded %+v, %v; want it back", tc.h, h, err)
		}
		if !tc.ok && !errors.Is(err, ErrFrame) {
			t.Errorf("%+v: accepted (%v), want ErrFrame", tc.h, err)
		}
	}
}

// TestDecodeLease: a lease is asked for one region whole (one
// descriptor) and granted as one iovec (one IPC record for GPU memory); a revocation carries nothing but
// the lease's id.
func TestDecodeLease(t *testing.T) {
	for _, tc := range []struct {
		h  header
		ok bool
	}{
		{header{kind: kReq, sub: rLease, id: 1, a: 10, b: 1, payload: stripeSize + DescSize}, true},
		{header{kind: kReq, sub: rLease, id: 1, a: 10, b: 2, payload: stripeSize + 2*DescSize}, false},
		{header{kind: kReq, sub: rLease, id: 1, a: 0, b: 1, payload: stripeSize + DescSize}, false},
		{header{kind: kReq, sub: rLease, id: 1, a: MaxLen + 1, b: 1, payload: stripeSize + DescSize}, false},
		{header{kind: kReq, sub: rLease, id: 1, a: 10, b: 1, payload: DescSize}, false},
		{header{kind: kResp, sub: rLease, id: 1, b: 1, payload: IovSize}, true},
		{header{kind: kResp, sub: rLease, id: 1, b: 2, payload: 2 * IovSize}, false},
		{header{kind: kResp, sub: rLease, id: 1, b: 1, payload: IovSize - 1}, false},
		{header{kind: kResp, sub: rLease, id: 1, status: stKey}, true},
		{header{kind: kResp, sub: rLease, id: 1, status: stKey, a: 5}, false},
		{header{kind: kReq, sub: rLeaseG, id: 1, a: 10, b: 1, payload: stripeSize + DescSize}, true},
		{header{kind: kReq, sub: rLeaseG, id: 1, a: 10, b: 2, payload: stripeSize + 2*DescSize}, false},
		{header{kind: kResp, sub: rLeaseG, id: 1, b: 1, payload: IPCRecSize}, true},
		{header{kind: kResp, sub: rLeaseG, id: 1, b: 2, payload: 2 * IPCRecSize}, false},
		{header{kind: kResp, sub: rLeaseG, id: 1, b: 1, payload: IovSize}, false},
		{header{kind: kResp, sub: rLeaseG, id: 1, status: stNotHost}, true},
		{header{kind: kReq, sub: rWriteImm, id: 1, a: 8, b: 1, payload: stripeSize + DescSize + immSize}, true},
		{header{kind: kReq, sub: rWriteImm, id: 1, a: 8, b: 1, payload: stripeSize + DescSize}, false},
		{header{kind: kResp, sub: rWriteImm, id: 1}, false},
		{header{kind: kRevoke, id: 7}, true},
		{header{kind: kRevoke, id: 7, a: 1}, false},
		{header{kind: kRevoke, id: 7, payload: 8}, false},
		{header{kind: kRevoke, id: 7, sub: rLease}, false},
	} {
		_, err := decodeHeader(hdr(tc.h))
		if (err == nil) != tc.ok {
			t.Errorf("%+v: %v, want ok %v", tc.h, err, tc.ok)
		}
	}
}

// TestDecodeIPCGrant: an IPC grant's records are checked before any
// handle is opened: a length of 1 to MaxLen, an offset of at most
// MaxLen, as many records as the header says, adding up to the request.
func TestDecodeIPCGrant(t *testing.T) {
	enc := func(rs ...ipcRec) []byte {
		b := make([]byte, len(rs)*IPCRecSize)
		for i := range rs {
			rs[i].put(b[i*IPCRecSize:])
		}
		return b
	}
	h := [kernels.IPCHandleBytes]byte{1, 2, 3}
	for _, tc := range []struct {
		name  string
		b     []byte
		n     int
		total uint64
		ok    bool
	}{
		{"one", enc(ipcRec{h, 8, 100}), 1, 100, true},
		{"two", enc(ipcRec{h, 0, 1}, ipcRec{h, MaxLen, MaxLen}), 2, MaxLen + 1, true},
		{"short of the request", enc(ipcRec{h, 0, 99}), 1, 100, false},
		{"more than the request", enc(ipcRec{h, 0, 60}, ipcRec{h, 0, 60}), 2, 100, false},
		{"empty range", enc(ipcRec{h, 0, 0}, ipcRec{h, 0, 100}), 2, 100, false},
		{"too long", enc(ipcRec{h, 0, MaxLen + 1}), 1, MaxLen + 1, false},
		{"offset too far", enc(ipcRec{h, MaxLen + 1, 100}), 1, 100, false},
		{"count differs", enc(ipcRec{h, 0, 100}), 2, 100, false},
		{"truncated", enc(ipcRec{h, 0, 100})[:IPCRecSize-1], 1, 100, false},
		{"none", nil, 0, 0, false},
	} {
		rs, err := decodeIPCGrant(tc.b, tc.n, tc.total, nil)
		if (err == nil) != tc.ok || err != nil && !errors.Is(err, ErrFrame) {
			t.Errorf("%s: %v, want ok %v", tc.name, err, tc.ok)
		}
		if err == nil && (len(rs) != tc.n || rs[0].h != h) {
			t.Errorf("%s: decoded %d records %+v", tc.name, len(rs), rs)
		}
	}
}

// FuzzDecodeIPCGrant: the IPC grant decoder never panics, and what it
// accepts are n bounded, non-empty ranges that add up to the request.
func FuzzDecodeIPCGrant(f *testing.F) {
	r := ipcRec{h: [kernels.IPCHandleBytes]byte{9}, off: 4096, n: 1 << 20}
	b := make([]byte, IPCRecSize)
	r.put(b)
	f.Add(b, 1, uint64(1<<20))
	f.Add(append(b, b...), 2, uint64(2<<20))
	f.Fuzz(func(t *testing.T, b []byte, n int, total uint64) {
		rs, err := decodeIPCGrant(b, n, total, nil)
		if err != nil {
			if !errors.Is(err, ErrFrame) {
				t.Fatalf("an error that is not ErrFrame: %v", err)
			}
			return
		}
		var sum uint64
		for i, r := range rs {
			if r.n == 0 || r.n > MaxLen || r.off > MaxLen {
				t.Fatalf("accepted %+v", r)
			}
			q := make([]byte, IPCRecSize)
			r.put(q)
			if !bytes.Equal(q, b[i*IPCRecSize:(i+1)*IPCRecSize]) {
				t.Fatalf("record %d does not encode back", i)
			}
			sum += r.n
		}
		if len(rs) != n || sum != total || len(b) != n*IPCRecSize {
			t.Fatalf("accepted %d records of %d bytes for %d (n %d, %d bytes)", len(rs), sum, total, n, len(b))
		}
	})
}

// FuzzDecodeDescs: the descriptor decoder never panics, and what it
// accepts is a batch whose every range is non-empty and bounded and whose
// bytes hold the stripe it names.
func FuzzDecodeDescs(f *testing.F) {
	enc := func(lo uint64, ds ...desc) []byte {
		b := binary.LittleEndian.AppendUint64(nil, lo)
		for _, d := range ds {
			p := make([]byte, DescSize)
			d.put(p)
			b = append(b, p...)
		}
		return b
	}
	f.Add(enc(0, desc{1, 2, 3, 4}), 1, uint64(4))
	f.Add(enc(2, desc{1, 2, 3, 4}, desc{5, 6, 0, 10}), 2, uint64(12))
	f.Add(enc(0, desc{1, 2, 1 << 62, 1 << 62}), 1, uint64(1))
	f.Fuzz(func(t *testing.T, b []byte, n int, total uint64) {
		ds, lo, err := decodeDescs(b, n, total, nil)
		if err != nil {
			return
		}
		var sum uint64
		for _, d := range ds {
			if d.len == 0 || d.len > MaxLen || d.off > MaxLen {
				t.Fatalf("accepted %+v", d)
			}
			sum += d.len
		}
		if len(ds) != n || lo+total > sum || sum > MaxLen {
			t.Fatalf("accepted a stripe of %d at %d of %d bytes in %d descriptors", total, lo, sum, len(ds))
		}
	})
}

// FuzzDecodeInfo: the Info parser never panics, and what it accepts
// encodes back to the same bytes, with an address that is a literal
// ip:port and valid names.
func FuzzDecodeInfo(f *testing.F) {
	in := info{name: "a", addr: "127.0.0.1:5", host: "h/x", pid: 3, token: 4, tokenAddr: 5,
		regions: []RemoteRegion{{Name: "r", ID: 1, Key: 2, Size: 3}}}
	f.Add(in.encode())
	f.Add((&info{name: "b", addr: "[::1]:80"}).encode())
	f.Add((&info{name: "b", addr: "example.com:80"}).encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		in, err := decodeInfo(b)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("an error that is not ErrInvalid: %v", err)
			}
			return
		}
		if !bytes.Equal(in.encode(), b) {
			t.Fatalf("%+v does not encode back", in)
		}
		if host, _, err := net.SplitHostPort(in.addr); err != nil || net.ParseIP(host) == nil {
			t.Fatalf("accepted the address %q", in.addr)
		}
		if validName(in.name) != nil || in.name == "" {
			t.Fatalf("accepted the name %q", in.name)
		}
	})
}

// TestInfoRejects: Info values that are not to be trusted are refused.
func TestInfoRejects(t *testing.T) {
	good := info{name: "a", addr: "127.0.0.1:5", host: "h"}
	for name, in := range map[string]info{
		"host name":   {name: "a", addr: "localhost:5"},
		"port 0":      {name: "a", addr: "127.0.0.1:0"},
		"no port":     {name: "a", addr: "127.0.0.1"},
		"slash":       {name: "a/b", addr: "127.0.0.1:5"},
		"empty name":  {addr: "127.0.0.1:5"},
		"zero region": {name: "a", addr: "127.0.0.1:5", regions: []RemoteRegion{{Name: "r"}}},
	} {
		if _, err := decodeInfo(in.encode()); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
	b := good.encode()
	if _, err := decodeInfo(b); err != nil {
		t.Fatal(err)
	}
	if _, err := decodeInfo(append(b, 0)); err == nil {
		t.Error("trailing bytes accepted")
	}
	if _, err := decodeInfo(b[:len(b)-1]); err == nil {
		t.Error("a truncated info accepted")
	}
}

// TestHostileFrames: a member of the job (it holds the secret) that sends
// malformed frames, or requests outside every region, has its link closed
// or its requests refused; the endpoint writes nothing and goes on
// serving its other peers.
func TestHostileFrames(t *testing.T) {
	_, b, ab, _ := pair(t, func(o *Options) { o.Channels = 1 })
	a := ab.e
	ctx := ctxT(t, 20*time.Second)
	mem := make([]byte, 4096)
	fill(mem, 1)
	orig := append([]byte(nil), mem...)
	r, _ := b.Register("m", mem)
	rr := r.Remote()
	// dial opens a raw link to b as "evil" with one channel.
	dial := func() net.Conn { return member(t, b, helloFrame(77, 0, 1, 1000, 0, "evil"), 0) }
	// The hostile link's requests: out of bounds with the right key, and
	// a write whose data frames lie about their length.
	req := func(sub uint8, id uint64, d desc) []byte {
		p := make([]byte, stripeSize+DescSize)
		d.put(p[stripeSize:])
		return append(hdr(header{kind: kReq, sub: sub, id: id, a: d.len, b: 1, payload: uint32(len(p))}), p...)
	}
	c := dial()
	defer c.Close()
	c.Write(req(rWrite, 1, desc{rr.ID, rr.Key, 4000, 200}))
	c.Write(append(hdr(header{kind: kData, id: 1, payload: 200}), make([]byte, 200)...))
	c.Write(req(rWriteV, 2, desc{rr.ID, rr.Key, 1 << 40, 1}))
	c.Write(req(rRead, 3, desc{rr.ID, rr.Key ^ 1, 0, 1}))
	for want := range 3 {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		var buf [HeaderSize]byte
		for {
			if _, err := readFull(c, buf[:]); err != nil {
				t.Fatalf("answer %d: %v", want, err)
			}
			if h, _ := decodeHeader(buf[:]); h.kind != kPing {
				if h.kind != kResp || h.status == stOK {
					t.Fatalf("answer %d: %+v, want a refusal", want, h)
				}
				break
			}
		}
	}
	// Garbage: the link is closed.
	c.Write(bytes.Repeat([]byte{0xff}, HeaderSize))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		var buf [HeaderSize]byte
		if _, err := readFull(c, buf[:]); err != nil {
			break
		}
	}
	// A data frame longer than its write: the link is closed.
	c2 := dial()
	defer c2.Close()
	c2.Write(req(rWrite, 1, desc{rr.ID, rr.Key, 0, 10}))
	c2.Write(append(hdr(header{kind: kData, id: 1, payload: 20}), make([]byte, 20)...))
	c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		var buf [HeaderSize]byte
		if _, err := readFull(c2, buf[:]); err != nil {
			break
		}
	}
	if !bytes.Equal(mem, orig) {
		t.Fatal("a hostile request changed the region")
	}
	// The honest peer is still served.
	lr, _ := a.Register("l", make([]byte, 4096))
	if err := ab.Read([]Op{{Local: lr, Remote: rr, Len: 4096}}).Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(lr.Bytes(), orig) {
		t.Fatal("the honest read differs")
	}
	_ = ctx
}

// FuzzRemoteRegion: RemoteRegion.UnmarshalBinary, which takes bytes handed
// over out of band (a store, a file, another program), never panics,
// refuses with ErrInvalid, and what it accepts has a valid name and a size
// of 1 to MaxLen and marshals back to the same bytes.
func FuzzRemoteRegion(f *testing.F) {
	good, _ := RemoteRegion{Name: "kv", ID: 1, Key: 2, Size: 4096}.MarshalBinary()
	f.Add(good)
	f.Add(good[:24])
	f.Add(append(append([]byte(nil), good[:24]...), "a/b"...))
	f.Add(make([]byte, 24))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := RemoteRegion{Name: "unchanged"}
		if err := r.UnmarshalBinary(b); err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("an error that is not ErrInvalid: %v", err)
			}
			if r.Name != "unchanged" {
				t.Fatalf("a refused value changed the region: %+v", r)
			}
			return
		}
		if validName(r.Name) != nil || r.Size == 0 || r.Size > MaxLen {
			t.Fatalf("accepted %+v", r)
		}
		if back, _ := r.MarshalBinary(); !bytes.Equal(back, b) {
			t.Fatalf("%+v does not marshal back", r)
		}
	})
}

// FuzzProcAddr: the parser of /proc/net/tcp and tcp6 addresses never
// panics, and what it accepts is 8 or 32 hex digits, a colon and a port
// of at most four hex digits.
func FuzzProcAddr(f *testing.F) {
	for _, s := range []string{"0100007F:1F90", "0000000000000000FFFF00000100007F:1F90", "00000000000000000000000001000000:0050", "", ":", "0100007F:10000"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := procAddr(s)
		if err != nil {
			return
		}
		h, p, _ := strings.Cut(s, ":")
		port, perr := strconv.ParseUint(p, 16, 16)
		if len(h) != 8 && len(h) != 32 || strings.Trim(h, "0123456789abcdefABCDEF") != "" || perr != nil || uint64(a.Port()) != port {
			t.Fatalf("procAddr(%q) accepted %v", s, a)
		}
		if !a.IsValid() || len(h) == 8 && !a.Addr().Is4() {
			t.Fatalf("procAddr(%q) = %v", s, a)
		}
	})
}
