package socktable

import (
	"encoding/binary"
	"errors"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// equateAddrs lets cmp compare netip values by ==.
var equateAddrs = cmpopts.EquateComparable(netip.Addr{}, netip.AddrPort{})

// The encoder below writes what the kernel writes (net/ipv4/inet_diag.c,
// net/core/bpf_sk_storage.c), so the parser can be tested without it.

func nlmsg(typ uint16, seq uint32, body []byte) []byte {
	ne := binary.NativeEndian
	b := make([]byte, align4(nlmsgHdrLen+len(body)))
	ne.PutUint32(b[0:4], uint32(nlmsgHdrLen+len(body)))
	ne.PutUint16(b[4:6], typ)
	ne.PutUint16(b[6:8], 2) // NLM_F_MULTI
	ne.PutUint32(b[8:12], seq)
	copy(b[nlmsgHdrLen:], body)
	return b
}

func attr(typ uint16, v []byte) []byte {
	b := make([]byte, align4(4+len(v)))
	binary.NativeEndian.PutUint16(b[0:2], uint16(4+len(v)))
	binary.NativeEndian.PutUint16(b[2:4], typ)
	copy(b[4:], v)
	return b
}

func u32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

func i32(v int32) []byte { return u32(uint32(v)) }

func putAddr(b []byte, family uint8, a netip.Addr) {
	if family == FamilyIPv4 {
		copy(b, a.AsSlice())
		return
	}
	a16 := a.As16() // IPv4 as IPv4-mapped, as the kernel has it
	copy(b, a16[:])
}

// encodeSocket is the SOCK_DIAG_BY_FAMILY message of s.
func encodeSocket(s Socket, seq uint32) []byte { return encodeSocketAs(sockDiagByFamily, s, seq) }

// encodeSocketAs is the message of s answering a request of type typ: the
// kernel gives each the request's type.
func encodeSocketAs(typ uint16, s Socket, seq uint32) []byte {
	ne := binary.NativeEndian
	m := make([]byte, inetDiagMsgLen)
	m[0] = s.Family
	m[1] = uint8(s.State)
	binary.BigEndian.PutUint16(m[4:6], s.Local.Port())
	binary.BigEndian.PutUint16(m[6:8], s.Remote.Port())
	putAddr(m[8:24], s.Family, s.Local.Addr())
	putAddr(m[24:40], s.Family, s.Remote.Addr())
	ne.PutUint32(m[44:48], uint32(s.Cookie))
	ne.PutUint32(m[48:52], uint32(s.Cookie>>32))
	ne.PutUint32(m[64:68], s.UID)
	ne.PutUint32(m[68:72], s.Inode)
	m = append(m, attr(8, []byte{0})...) // INET_DIAG_SHUTDOWN, always there
	if s.V6Only {
		m = append(m, attr(inetDiagSkV6Only, []byte{1})...)
	}
	if len(s.Storage) > 0 {
		var stores []byte
		for _, id := range slices.Sorted(maps.Keys(s.Storage)) {
			e := attr(storageEntryMapID, u32(id))
			e = append(e, attr(storageEntryValue, s.Storage[id])...)
			stores = append(stores, attr(storageEntry|0x8000, e)...)
		}
		m = append(m, attr(inetDiagStorages|0x8000, stores)...)
	}
	return nlmsg(typ, seq, m)
}

// unpadded is m, one message ending in an attribute of one byte, as it
// would be with neither the attribute nor the message padded.
func unpadded(m []byte) []byte {
	m = m[:len(m)-3]
	binary.NativeEndian.PutUint32(m[0:4], uint32(len(m)))
	return m
}

func encodeDone(seq uint32) []byte { return nlmsg(nlmsgDone, seq, i32(0)) }

func concat(parts ...[]byte) []byte { return slices.Concat(parts...) }

var (
	listener = Socket{Family: FamilyIPv4, State: Listen, Local: netip.MustParseAddrPort("10.1.2.3:8080"),
		Remote: netip.MustParseAddrPort("0.0.0.0:0"), Cookie: 1 << 40, Inode: 77, UID: 1000}
	conn6 = Socket{Family: FamilyIPv6, State: Established, Local: netip.MustParseAddrPort("10.1.2.3:8080"),
		Remote: netip.MustParseAddrPort("10.9.9.9:40000"), Cookie: 42, Inode: 78,
		Storage: map[uint32][]byte{7: {1, 2, 3, 4}, 9: {5}}}
	listen6 = Socket{Family: FamilyIPv6, State: Listen, Local: netip.MustParseAddrPort("[::]:443"),
		Remote: netip.MustParseAddrPort("[::]:0"), Cookie: 43, Inode: 79, V6Only: true}
)

func TestParseDump(t *testing.T) {
	const seq = 5
	tests := []struct {
		name     string
		in       []byte
		typ      uint16 // of the request; SOCK_DIAG_BY_FAMILY when 0
		want     []Socket
		wantDone bool
		wantErr  string
		wantIs   error
	}{
		{name: "sockets and done", in: concat(encodeSocket(listener, seq), encodeSocket(conn6, seq), encodeSocket(listen6, seq), encodeDone(seq)),
			want: []Socket{listener, conn6, listen6}, wantDone: true},
		{name: "part of a multi-part answer", in: concat(encodeSocket(listener, seq)), want: []Socket{listener}},
		{name: "done alone", in: encodeDone(seq), wantDone: true},
		{name: "done without its int", in: nlmsg(nlmsgDone, seq, nil), wantDone: true},
		{name: "last message without padding", in: unpadded(encodeSocket(listener, seq)), want: []Socket{listener}},
		{name: "legacy request's answer", typ: tcpDiagGetSock,
			in:   concat(encodeSocketAs(tcpDiagGetSock, listener, seq), encodeSocketAs(tcpDiagGetSock, conn6, seq), encodeDone(seq)),
			want: []Socket{listener, conn6}, wantDone: true},
		{name: "SOCK_DIAG_BY_FAMILY answering a legacy request", typ: tcpDiagGetSock, in: encodeSocket(listener, seq),
			wantErr: "message type 20 answering a request of type 18", wantIs: errMalformed},
		{name: "legacy answer to SOCK_DIAG_BY_FAMILY", in: encodeSocketAs(tcpDiagGetSock, listener, seq),
			wantErr: "message type 18 answering a request of type 20", wantIs: errMalformed},
		{name: "noop skipped", in: concat(nlmsg(nlmsgNoop, seq, nil), encodeSocket(listener, seq)), want: []Socket{listener}},
		{name: "kernel refuses", in: nlmsg(nlmsgError, seq, concat(i32(-int32(syscall.EINVAL)), make([]byte, 16))),
			wantErr: "refused the request", wantIs: syscall.EINVAL},
		{name: "kernel refuses the legacy request", typ: tcpDiagGetSock, in: nlmsg(nlmsgError, seq, concat(i32(-int32(syscall.EOPNOTSUPP)), make([]byte, 16))),
			wantErr: "refused the request", wantIs: errRefused},
		{name: "dump failed midway", in: nlmsg(nlmsgDone, seq, i32(-int32(syscall.ENOBUFS))), wantDone: true,
			wantErr: "ended the dump", wantIs: syscall.ENOBUFS},
		{name: "acknowledgement", in: nlmsg(nlmsgError, seq, i32(0)), wantErr: "acknowledgement", wantIs: errMalformed},
		{name: "short header", in: encodeDone(seq)[:10], wantErr: "less than a message header", wantIs: errMalformed},
		{name: "length past the end", in: encodeSocket(listener, seq)[:60], wantErr: "message of", wantIs: errMalformed},
		{name: "other request's answer", in: encodeSocket(listener, seq+1), wantErr: "sequence 6", wantIs: errMalformed},
		{name: "unknown message", in: nlmsg(99, seq, nil), wantErr: "message type 99", wantIs: errMalformed},
		{name: "short inet_diag_msg", in: nlmsg(sockDiagByFamily, seq, make([]byte, 71)), wantErr: "inet_diag_msg of 71", wantIs: errMalformed},
		{name: "unknown family", in: nlmsg(sockDiagByFamily, seq, append([]byte{3}, make([]byte, 71)...)), wantErr: "family 3", wantIs: errMalformed},
		{name: "attribute past the end", in: nlmsg(sockDiagByFamily, seq, concat(encodeSocket(listener, seq)[nlmsgHdrLen:nlmsgHdrLen+inetDiagMsgLen], []byte{200, 0, 8, 0})),
			wantErr: "attribute of 200", wantIs: errMalformed},
		{name: "storage without value", in: nlmsg(sockDiagByFamily, seq, concat(encodeSocket(listener, seq)[nlmsgHdrLen:nlmsgHdrLen+inetDiagMsgLen],
			attr(inetDiagStorages, attr(storageEntry, attr(storageEntryMapID, u32(3)))))), wantErr: "without a map ID and a value", wantIs: errMalformed},
		{name: "bytes after done", in: concat(encodeDone(seq), encodeSocket(listener, seq)), wantDone: true, wantErr: "after NLMSG_DONE", wantIs: errMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			typ := tt.typ
			if typ == 0 {
				typ = sockDiagByFamily
			}
			got, done, err := parseDump(tt.in, seq, typ, nil)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, tt.wantIs) {
					t.Fatalf("err = %v, want one saying %q and wrapping %v", err, tt.wantErr, tt.wantIs)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if done != tt.wantDone {
				t.Errorf("done = %v, want %v", done, tt.wantDone)
			}
			if tt.wantErr == "" {
				if diff := cmp.Diff(tt.want, got, equateAddrs); diff != "" {
					t.Errorf("sockets (-want +got):\n%s", diff)
				}
			}
		})
	}
}

// FuzzParseDump feeds parseDump any datagram, as the answer to a
// SOCK_DIAG_BY_FAMILY request and as the answer to a legacy
// TCPDIAG_GETSOCK one. Invariants:
//   - it never panics, and every error is errMalformed or a kernel errno
//     (a refusal both errRefused and the errno);
//   - every socket it returns is IPv4 or IPv6, with no IPv4-mapped address
//     left, an IPv4 socket only IPv4 addresses, and storage values never
//     empty maps;
//   - what it returns does not change when b is overwritten afterwards;
//   - encoding what it returned the way the kernel would parses back to
//     the same sockets and the same done;
//   - no datagram gives sockets as the answer to both request types.
func FuzzParseDump(f *testing.F) {
	const seq = 5
	f.Add(concat(encodeSocket(listener, seq), encodeSocket(conn6, seq), encodeSocket(listen6, seq), encodeDone(seq)))
	f.Add(encodeSocket(conn6, seq))
	f.Add(encodeDone(seq))
	f.Add(nlmsg(nlmsgError, seq, i32(-int32(syscall.EPERM))))
	f.Add(encodeSocket(conn6, seq)[:100])
	f.Add(concat(encodeSocketAs(tcpDiagGetSock, listen6, seq), encodeSocketAs(tcpDiagGetSock, conn6, seq), encodeDone(seq)))
	f.Add(nlmsg(nlmsgError, seq, i32(-int32(syscall.EOPNOTSUPP))))
	f.Fuzz(func(t *testing.T, b []byte) {
		n := 0
		for _, typ := range []uint16{sockDiagByFamily, tcpDiagGetSock} {
			if checkParse(t, b, seq, typ) > 0 {
				n++
			}
		}
		if n > 1 {
			t.Fatal("sockets as the answer to both request types")
		}
	})
}

// checkParse checks FuzzParseDump's invariants for b as the answer to a
// request of type typ, and says how many sockets it gave without error.
func checkParse(t *testing.T, b []byte, seq uint32, typ uint16) int {
	t.Helper()
	in := slices.Clone(b)
	got, done, err := parseDump(in, seq, typ, nil)
	var errno syscall.Errno
	if err != nil && !errors.Is(err, errMalformed) && !errors.As(err, &errno) {
		t.Fatalf("type %d: error neither malformed nor the kernel's: %v", typ, err)
	}
	if errors.Is(err, errRefused) && !errors.As(err, &errno) {
		t.Fatalf("type %d: refusal without the kernel's errno: %v", typ, err)
	}
	for _, s := range got {
		l, r := s.Local.Addr(), s.Remote.Addr()
		switch {
		case s.Family != FamilyIPv4 && s.Family != FamilyIPv6:
			t.Fatalf("family %d", s.Family)
		case l.Is4In6() || r.Is4In6():
			t.Fatalf("mapped address left: %v", s)
		case s.Family == FamilyIPv4 && (!l.Is4() || !r.Is4()):
			t.Fatalf("IPv4 socket with other addresses: %v", s)
		case s.Storage != nil && len(s.Storage) == 0:
			t.Fatalf("empty storage map: %v", s)
		}
	}
	if err != nil {
		return 0
	}
	before := cloneSockets(got)
	for i := range in {
		in[i] ^= 0xff
	}
	if diff := cmp.Diff(before, got, equateAddrs); diff != "" {
		t.Fatalf("type %d: the result changed with its input buffer (-before +after):\n%s", typ, diff)
	}
	var again []byte
	for _, s := range got {
		again = append(again, encodeSocketAs(typ, s, seq)...)
	}
	if done {
		again = append(again, encodeDone(seq)...)
	}
	got2, done2, err := parseDump(again, seq, typ, nil)
	if err != nil {
		t.Fatalf("type %d: re-encoded answer: %v", typ, err)
	}
	if diff := cmp.Diff(got, got2, equateAddrs); diff != "" || done2 != done {
		t.Fatalf("type %d: round trip (-first +second), done %v then %v:\n%s", typ, done, done2, diff)
	}
	return len(got)
}

func cloneSockets(socks []Socket) []Socket {
	out := slices.Clone(socks)
	for i, s := range out {
		if s.Storage != nil {
			out[i].Storage = make(map[uint32][]byte, len(s.Storage))
			for id, v := range s.Storage {
				out[i].Storage[id] = slices.Clone(v)
			}
		}
	}
	return out
}
