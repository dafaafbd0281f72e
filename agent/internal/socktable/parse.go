package socktable

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
)

// The netlink and sock_diag numbers the parser needs (linux/netlink.h,
// linux/sock_diag.h, linux/inet_diag.h), named here rather than taken from
// x/sys/unix so the parser (and its fuzz target) builds on every platform.
const (
	nlmsgHdrLen       = 16
	nlmsgNoop         = 1
	nlmsgError        = 2
	nlmsgDone         = 3
	tcpDiagGetSock    = 18 // TCPDIAG_GETSOCK, the legacy request
	sockDiagByFamily  = 20
	nlaTypeMask       = 0x3fff // without NLA_F_NESTED and NLA_F_NET_BYTEORDER
	inetDiagMsgLen    = 72     // struct inet_diag_msg
	inetDiagReqLen    = 60     // struct inet_diag_req, the legacy request's
	inetDiagReqV2Len  = 56     // struct inet_diag_req_v2
	inetDiagSkV6Only  = 11     // INET_DIAG_SKV6ONLY, u8
	inetDiagStorages  = 20     // INET_DIAG_SK_BPF_STORAGES, nested
	reqSkBPFStorages  = 2      // INET_DIAG_REQ_SK_BPF_STORAGES, nested
	storageReqMapFD   = 1      // SK_DIAG_BPF_STORAGE_REQ_MAP_FD, u32
	storageEntry      = 1      // SK_DIAG_BPF_STORAGE, nested
	storageEntryMapID = 2      // SK_DIAG_BPF_STORAGE_MAP_ID, u32
	storageEntryValue = 3      // SK_DIAG_BPF_STORAGE_MAP_VALUE, bytes
)

// errMalformed marks an answer that does not parse: the kernel never sends
// one, so it means a bug on either side, never a retry.
var errMalformed = errors.New("malformed sock_diag answer")

// errRefused marks the kernel's NLMSG_ERROR answer to a request: the dump
// never started (the error also wraps the kernel's errno).
var errRefused = errors.New("the kernel refused the request")

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errMalformed, fmt.Sprintf(format, args...))
}

// align4 rounds n up to netlink's 4-byte alignment (NLMSG_ALIGN, NLA_ALIGN).
func align4(n int) int { return (n + 3) &^ 3 }

// parseDump parses one datagram of the answer to a sock_diag dump request
// with sequence number seq and message type typ: messages of type typ
// (the kernel answers each socket with the request's own type,
// SOCK_DIAG_BY_FAMILY or TCPDIAG_GETSOCK), each appended to socks, and at
// the end NLMSG_DONE, after which done is true. An NLMSG_ERROR (the kernel
// refused the request) is returned as an error wrapping errRefused and its
// errno; anything truncated or malformed as an error wrapping errMalformed.
// It never panics and keeps no reference to b.
func parseDump(b []byte, seq uint32, typ uint16, socks []Socket) (_ []Socket, done bool, err error) {
	ne := binary.NativeEndian
	for len(b) > 0 {
		if len(b) < nlmsgHdrLen {
			return socks, false, malformed("%d bytes left, less than a message header", len(b))
		}
		n := int(ne.Uint32(b[0:4]))
		msgType := ne.Uint16(b[4:6])
		if n < nlmsgHdrLen || n > len(b) {
			return socks, false, malformed("message of %d bytes with %d left", n, len(b))
		}
		if got := ne.Uint32(b[8:12]); got != seq {
			return socks, false, malformed("message of sequence %d answering request %d", got, seq)
		}
		body := b[nlmsgHdrLen:n]
		// The last message of a datagram may lack its padding.
		b = b[min(align4(n), len(b)):]
		switch msgType {
		case nlmsgNoop:
		case nlmsgDone:
			// A dump that failed after it started says so in DONE's int.
			if len(body) >= 4 {
				if code := int32(ne.Uint32(body)); code < 0 {
					return socks, true, fmt.Errorf("the kernel ended the dump with an error: %w", syscall.Errno(-code))
				}
			}
			if len(b) > 0 {
				return socks, true, malformed("%d bytes after NLMSG_DONE", len(b))
			}
			return socks, true, nil
		case nlmsgError:
			if len(body) < 4 {
				return socks, false, malformed("NLMSG_ERROR of %d bytes", len(body))
			}
			code := int32(ne.Uint32(body))
			if code == 0 {
				// An acknowledgement, which a dump does not ask for.
				return socks, false, malformed("unexpected acknowledgement")
			}
			if code > 0 {
				return socks, false, malformed("NLMSG_ERROR with positive code %d", code)
			}
			return socks, false, fmt.Errorf("%w: %w", errRefused, syscall.Errno(-code))
		case typ:
			s, err := parseSocket(body)
			if err != nil {
				return socks, false, err
			}
			socks = append(socks, s)
		default:
			return socks, false, malformed("message type %d answering a request of type %d", msgType, typ)
		}
	}
	return socks, false, nil
}

// parseSocket parses one struct inet_diag_msg and its attributes.
func parseSocket(b []byte) (Socket, error) {
	ne := binary.NativeEndian
	if len(b) < inetDiagMsgLen {
		return Socket{}, malformed("inet_diag_msg of %d bytes", len(b))
	}
	s := Socket{
		Family: b[0],
		State:  State(b[1]),
		Cookie: uint64(ne.Uint32(b[44:48])) | uint64(ne.Uint32(b[48:52]))<<32,
		UID:    ne.Uint32(b[64:68]),
		Inode:  ne.Uint32(b[68:72]),
	}
	sport := binary.BigEndian.Uint16(b[4:6])
	dport := binary.BigEndian.Uint16(b[6:8])
	switch s.Family {
	case FamilyIPv4:
		s.Local = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[8:12])), sport)
		s.Remote = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[24:28])), dport)
	case FamilyIPv6:
		s.Local = netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[8:24])).Unmap(), sport)
		s.Remote = netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[24:40])).Unmap(), dport)
	default:
		return Socket{}, malformed("address family %d", s.Family)
	}
	err := walkAttrs(b[inetDiagMsgLen:], func(typ uint16, v []byte) error {
		switch typ {
		case inetDiagSkV6Only:
			if len(v) < 1 {
				return malformed("INET_DIAG_SKV6ONLY of %d bytes", len(v))
			}
			s.V6Only = v[0] != 0
		case inetDiagStorages:
			return walkAttrs(v, func(typ uint16, v []byte) error {
				if typ != storageEntry {
					return nil
				}
				return parseStorage(v, &s)
			})
		}
		return nil
	})
	if err != nil {
		return Socket{}, err
	}
	return s, nil
}

// parseStorage parses one SK_DIAG_BPF_STORAGE: a map ID and the socket's
// value in that map, which it copies (the receive buffer is reused).
func parseStorage(b []byte, s *Socket) error {
	var id uint32
	var value []byte
	var haveID, haveValue bool
	err := walkAttrs(b, func(typ uint16, v []byte) error {
		switch typ {
		case storageEntryMapID:
			if len(v) < 4 {
				return malformed("SK_DIAG_BPF_STORAGE_MAP_ID of %d bytes", len(v))
			}
			id, haveID = binary.NativeEndian.Uint32(v), true
		case storageEntryValue:
			value, haveValue = append([]byte{}, v...), true
		}
		return nil
	})
	if err != nil {
		return err
	}
	if !haveID || !haveValue {
		return malformed("SK_DIAG_BPF_STORAGE without a map ID and a value")
	}
	if _, dup := s.Storage[id]; dup {
		return malformed("two values of BPF map %d for one socket", id)
	}
	if s.Storage == nil {
		s.Storage = make(map[uint32][]byte)
	}
	s.Storage[id] = value
	return nil
}

// walkAttrs calls f with the type (flags removed) and value of each netlink
// attribute in b, stopping at f's first error.
func walkAttrs(b []byte, f func(typ uint16, v []byte) error) error {
	ne := binary.NativeEndian
	for len(b) > 0 {
		if len(b) < 4 {
			return malformed("%d bytes left, less than an attribute header", len(b))
		}
		n := int(ne.Uint16(b[0:2]))
		if n < 4 || n > len(b) {
			return malformed("attribute of %d bytes with %d left", n, len(b))
		}
		if err := f(ne.Uint16(b[2:4])&nlaTypeMask, b[4:n]); err != nil {
			return err
		}
		b = b[min(align4(n), len(b)):]
	}
	return nil
}
