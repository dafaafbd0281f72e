//go:build linux

package redirect

import (
	"encoding/binary"
	"maps"
	"net/netip"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/go-cmp/cmp"
)

// TestObjects keeps the object's maps, programs and attachments in step:
// every program is attached once, at its own hook, and nothing is a
// load-time variable.
func TestObjects(t *testing.T) {
	spec, err := loadRedirect()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"events", "lease", "origins", "redirected", "services"}, slices.Sorted(maps.Keys(spec.Maps))); diff != "" {
		t.Errorf("maps (-want +got):\n%s", diff)
	}
	if len(spec.Variables) != 0 {
		t.Errorf("variables %v, want none", slices.Sorted(maps.Keys(spec.Variables)))
	}
	want := map[string]ebpf.AttachType{}
	for _, at := range attachments {
		want["sockscale_"+at.name] = at.attach
	}
	got := map[string]ebpf.AttachType{}
	for name, p := range spec.Programs {
		if p.Type != ebpf.CGroupSockAddr {
			t.Errorf("program %s has type %v, want %v", name, p.Type, ebpf.CGroupSockAddr)
		}
		got[name] = p.AttachType
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("programs and their hooks (-attachments +object):\n%s", diff)
	}
}

// TestMapsLayout: the pin directory's name depends on the maps' layout and
// on nothing else, so a build that changes only code reuses the maps.
func TestMapsLayout(t *testing.T) {
	layout := func(change func(*ebpf.CollectionSpec)) string {
		t.Helper()
		spec, err := loadRedirect()
		if err != nil {
			t.Fatal(err)
		}
		change(spec)
		name, err := mapsLayout(spec)
		if err != nil {
			t.Fatal(err)
		}
		return name
	}
	base := layout(func(*ebpf.CollectionSpec) {})
	if again := layout(func(*ebpf.CollectionSpec) {}); again != base {
		t.Errorf("the same object gives layouts %s and %s", base, again)
	}
	if code := layout(func(s *ebpf.CollectionSpec) { s.Programs["sockscale_connect4"].Instructions[0].Constant++ }); code != base {
		t.Errorf("changing a program changed the layout: %s -> %s", base, code)
	}
	for name, change := range map[string]func(*ebpf.CollectionSpec){
		"max entries": func(s *ebpf.CollectionSpec) { s.Maps["services"].MaxEntries++ },
		"value size":  func(s *ebpf.CollectionSpec) { s.Maps["redirected"].ValueSize = 16 },
		"flags":       func(s *ebpf.CollectionSpec) { s.Maps["services"].Flags = 0 },
		"value type":  func(s *ebpf.CollectionSpec) { s.Maps["origins"].Value = s.Maps["services"].Value },
	} {
		if got := layout(change); got == base {
			t.Errorf("changing the maps' %s kept the layout %s", name, base)
		}
	}
}

// TestAddrKey: keys round-trip, an IPv4 address's key is its IPv4-mapped
// form (what connect4 looks up), and the old layout's key converts to the
// key Set writes for the same address.
func TestAddrKey(t *testing.T) {
	for _, tc := range []struct {
		in, want string
	}{
		{"10.96.0.10:80", "10.96.0.10:80"},
		{"[::ffff:10.96.0.10]:80", "10.96.0.10:80"},
		{"[fd5c:a1e:96::a]:443", "[fd5c:a1e:96::a]:443"},
	} {
		in := netip.MustParseAddrPort(tc.in)
		if got := keyAddr(addrKey(in)); got.String() != tc.want {
			t.Errorf("keyAddr(addrKey(%s)) = %s, want %s", tc.in, got, tc.want)
		}
	}
	v4 := netip.MustParseAddrPort("10.96.0.10:8080")
	if diff := cmp.Diff(addrKey(v4), addrKey(netip.AddrPortFrom(netip.AddrFrom16(v4.Addr().As16()), v4.Port()))); diff != "" {
		t.Errorf("IPv4 and IPv4-mapped keys differ (-IPv4 +mapped):\n%s", diff)
	}
	ip := v4.Addr().As4()
	var port [2]byte
	binary.BigEndian.PutUint16(port[:], v4.Port())
	old := v4SvcKey{IP: binary.NativeEndian.Uint32(ip[:]), Port: binary.NativeEndian.Uint16(port[:])}
	if diff := cmp.Diff(addrKey(v4), v4Key(old)); diff != "" {
		t.Errorf("the old layout's key of %s converts to (-want +got):\n%s", v4, diff)
	}
}
