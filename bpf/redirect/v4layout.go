//go:build linux

package redirect

import (
	"encoding/binary"
	"unsafe"

	"github.com/cilium/ebpf"
)

// The maps' layout before IPv6 (4-byte addresses), which an agent upgraded
// from such a build finds pinned. migrate converts its entries and counters
// into this build's maps, so connects keep being redirected across the
// upgrade. The structs are redirect.c's of that build, field for field.

// v4SvcKey was struct svc_key: the key of services and of redirected.
type v4SvcKey struct {
	IP   uint32 // IPv4, network order
	Port uint16 // network order
	Pad  uint16
}

// v4Backend was struct backend.
type v4Backend struct {
	IP     uint32 // IPv4, network order
	Port   uint16 // network order
	Weight uint16
}

// v4SvcEntry was struct svc_entry.
type v4SvcEntry struct {
	Lock     uint32 // struct bpf_spin_lock
	Count    uint32
	Total    uint32
	Svc      v4SvcKey
	Backends [MaxBackends]v4Backend
}

// v4ServicesShape reports whether m is the old layout's services map.
func v4ServicesShape(m *ebpf.Map) bool {
	return m.Type() == ebpf.Hash && m.KeySize() == uint32(unsafe.Sizeof(v4SvcKey{})) && m.ValueSize() == uint32(unsafe.Sizeof(v4SvcEntry{}))
}

// v4CountersShape reports whether m is the old layout's redirected map.
func v4CountersShape(m *ebpf.Map) bool {
	return m.Type() == ebpf.PerCPUHash && m.KeySize() == uint32(unsafe.Sizeof(v4SvcKey{})) && m.ValueSize() == 8
}

// mappedPrefix is the third word of an IPv4-mapped address, ::ffff:0:0/96,
// as the program compares it (network order).
var mappedPrefix = binary.NativeEndian.Uint32([]byte{0, 0, 0xff, 0xff})

// v4Addr is an old IPv4 word (network order) in the key's 16-byte form.
func v4Addr(ip uint32) redirectIpAddr {
	return redirectIpAddr{W: [4]uint32{0, 0, mappedPrefix, ip}}
}

// v4Key converts an old key: the same address and port, IPv4-mapped.
func v4Key(k v4SvcKey) redirectSvcKey {
	return redirectSvcKey{Ip: v4Addr(k.IP), Port: k.Port}
}

// v4Entry converts an old entry and its key: the same backends, count
// and total, each address IPv4-mapped; the unused backends stay zero.
func v4Entry(k v4SvcKey, e v4SvcEntry) (redirectSvcKey, redirectSvcEntry) {
	out := redirectSvcEntry{Count: e.Count, Total: e.Total, Svc: v4Key(e.Svc)}
	for i := range min(e.Count, MaxBackends) {
		b := e.Backends[i]
		out.Backends[i] = redirectBackend{Ip: v4Addr(b.IP), Port: b.Port, Weight: b.Weight}
	}
	return v4Key(k), out
}
