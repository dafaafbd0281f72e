package stats

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func batchOf(n int) *Batch {
	b := &Batch{Node: "node-a", Start: time.Unix(1700000000, 123456789), Period: time.Second}
	for i := range n {
		b.Pods = append(b.Pods, PodStat{
			IP:        netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}),
			Namespace: "team-" + fmt.Sprint(i%7), Pod: fmt.Sprintf("hello-7d9f8b6c5d-%05d", i), Workload: "hello",
			Concurrency: float64(i) * 0.37, ProxiedConcurrency: float64(i%3) * 0.1,
			Requests: uint64(i * 11), ProxiedRequests: uint64(i % 3),
		})
	}
	return b
}

// withTargets adds n activator records to b.
func withTargets(b *Batch, n int) *Batch {
	for i := range n {
		b.Targets = append(b.Targets, TargetStat{
			Namespace: "team-" + fmt.Sprint(i%7), Workload: fmt.Sprintf("hello-%d", i),
			Concurrency: float64(i) + 0.5, Requests: uint64(i * 3),
		})
	}
	return b
}

// withIPv6 makes every other pod of b (the first, the third...) an
// IPv6-only pod.
func withIPv6(b *Batch) *Batch {
	for i := 0; i < len(b.Pods); i += 2 {
		b.Pods[i].IP = netip.AddrFrom16([16]byte{0xfd, 0x00, 15: byte(i)})
	}
	return b
}

// withAccounting gives every third pod of b connection-level accounting
// (a quarter of its concurrency opaque) and the next one HTTP/2 streams.
func withAccounting(b *Batch) *Batch {
	for i := range b.Pods {
		p := &b.Pods[i]
		switch i % 3 {
		case 0:
			p.Accounting, p.OpaqueConcurrency = AccountingConnections, p.Concurrency/4
		case 1:
			p.Accounting = AccountingHTTP2Streams
		}
	}
	return b
}

func TestRoundTrip(t *testing.T) {
	for _, b := range []*Batch{batchOf(0), batchOf(1), batchOf(100), withTargets(batchOf(0), 1), withTargets(batchOf(3), 20),
		withAccounting(batchOf(1)), withAccounting(batchOf(100)), withTargets(withAccounting(batchOf(3)), 2),
		withIPv6(batchOf(1)), withIPv6(batchOf(100)), withTargets(withIPv6(withAccounting(batchOf(5))), 3)} {
		want, n := b, fmt.Sprintf("%d pods, %d targets", len(b.Pods), len(b.Targets))
		data, err := Append(nil, want)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(data)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got, cmpopts.EquateEmpty(), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
			t.Errorf("%s: round trip (-want +got):\n%s", n, diff)
		}
	}
}

// TestVersionFollowsContent: agents' batches (no targets) stay version 1,
// which controllers from before version 2 read during an upgrade, unless
// a pod's accounting needs version 3; without it, a batch stays what
// controllers from before version 3 read.
func TestVersionFollowsContent(t *testing.T) {
	http2Only := batchOf(3)
	http2Only.Pods[1].Accounting = AccountingHTTP2Streams
	for _, tc := range []struct {
		name string
		b    *Batch
		want byte
	}{
		{"pods", batchOf(3), 1},
		{"targets", withTargets(batchOf(0), 1), 2},
		{"pods and targets", withTargets(batchOf(3), 2), 2},
		{"pods counted per connection", withAccounting(batchOf(3)), 3},
		{"one pod with HTTP/2 streams", http2Only, 3},
		{"accounting and targets", withTargets(withAccounting(batchOf(3)), 2), 3},
		{"accounting dropped", withAccounting(batchOf(3)).WithoutAccounting(), 1},
		{"accounting dropped, targets kept", withTargets(withAccounting(batchOf(3)), 2).WithoutAccounting(), 2},
		{"one IPv6 pod", withIPv6(batchOf(1)), 4},
		{"IPv6 and IPv4 pods", withIPv6(batchOf(3)), 4},
		{"IPv6 pods, accounting and targets", withTargets(withAccounting(withIPv6(batchOf(3))), 2), 4},
		{"IPv6 dropped", withoutIPv6(withIPv6(batchOf(3))), 1},
		{"IPv6 dropped, accounting kept", withoutIPv6(withAccounting(withIPv6(batchOf(3)))), 3},
	} {
		data, err := Append(nil, tc.b)
		if err != nil {
			t.Fatal(err)
		}
		if got := data[len(magic)]; got != tc.want {
			t.Errorf("%s: version %d, want %d", tc.name, got, tc.want)
		}
	}
}

func withoutIPv6(b *Batch) *Batch {
	c, _ := b.WithoutIPv6()
	return c
}

// TestWithoutIPv6: the copy keeps the IPv4 pods' records as they were,
// in order, counts the IPv6 ones it left out, and b is left as it was.
func TestWithoutIPv6(t *testing.T) {
	b := withTargets(withIPv6(batchOf(5)), 1)
	got, dropped := b.WithoutIPv6()
	want := withTargets(batchOf(5), 1)
	want.Pods = []PodStat{want.Pods[1], want.Pods[3]}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("without IPv6 (-want +got):\n%s", diff)
	}
	if dropped != 3 {
		t.Errorf("dropped %d records, want 3", dropped)
	}
	if !b.Pods[0].IP.Is6() || len(b.Pods) != 5 {
		t.Errorf("WithoutIPv6 changed its batch: %+v", b.Pods)
	}
	plain := batchOf(2)
	if got, dropped := plain.WithoutIPv6(); got != plain || dropped != 0 {
		t.Errorf("a batch with no IPv6 pod was copied, or records dropped (%d)", dropped)
	}
}

// TestWithoutAccounting: the copy has the default accounting, the rest
// of every record as it was, and b is left as it was.
func TestWithoutAccounting(t *testing.T) {
	b := withTargets(withAccounting(batchOf(4)), 1)
	stripped := b.WithoutAccounting()
	want := withTargets(batchOf(4), 1)
	if diff := cmp.Diff(want, stripped, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("without accounting (-want +got):\n%s", diff)
	}
	if b.Pods[0].Accounting != AccountingConnections || b.Pods[1].Accounting != AccountingHTTP2Streams {
		t.Errorf("WithoutAccounting changed its batch: %+v", b.Pods[:2])
	}
	plain := batchOf(2)
	if got := plain.WithoutAccounting(); got != plain {
		t.Errorf("a batch with no accounting to drop was copied")
	}
}

func TestAppendRejects(t *testing.T) {
	b := batchOf(1)
	b.Period = 0
	if _, err := Append(nil, b); err == nil || !strings.Contains(err.Error(), "period 0s must be positive") {
		t.Errorf("zero period: err = %v", err)
	}
	for _, tc := range []struct {
		ip   netip.Addr
		want string
	}{
		{netip.Addr{}, "pod team-0/hello-7d9f8b6c5d-00000 has no address: want an IPv4 or IPv6 address"},
		{netip.MustParseAddr("::ffff:10.1.0.0"), "address ::ffff:10.1.0.0 is IPv4-mapped IPv6: want it as IPv4 (10.1.0.0)"},
		{netip.MustParseAddr("fe80::1%eth0"), "address fe80::1%eth0 has a zone: want a pod address without one"},
	} {
		b = batchOf(1)
		b.Pods[0].IP = tc.ip
		if _, err := Append(nil, b); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("address %v: err = %v, want it to mention %q", tc.ip, err, tc.want)
		}
	}
	b = batchOf(2)
	b.Pods[1].Accounting, b.Pods[1].OpaqueConcurrency = AccountingConnections, 1
	if _, err := Append(nil, b); err == nil || !strings.Contains(err.Error(), "opaque concurrency 1 exceeds the concurrency 0.37") {
		t.Errorf("opaque concurrency above concurrency: err = %v", err)
	}
	b = batchOf(2)
	b.Pods[1].Accounting = 7
	if _, err := Append(nil, b); err == nil || !strings.Contains(err.Error(), "accounting 7: want 0 (HTTP/1 requests), 1 (HTTP/2 streams) or 2 (connections)") {
		t.Errorf("unknown accounting: err = %v", err)
	}
}

func TestDecodeErrorsSayWhat(t *testing.T) {
	good, _ := Append(nil, batchOf(2))
	negative := batchOf(1)
	negative.Pods[0].Concurrency = -1
	neg, _ := Append(nil, negative)
	withTarget, _ := Append(nil, withTargets(batchOf(1), 1))
	// A version 2 header, no pods, then a target count of 0.
	noTargets := []byte("SSST\x02\x00\x00\x02\x00\x00")
	// Version 3 pod records whose accounting bytes are then spoiled: the
	// first record's accounting byte is at accountingAt.
	accounted := withAccounting(batchOf(1))
	accounted.Pods[0].Concurrency, accounted.Pods[0].OpaqueConcurrency = 2, 1
	v3, _ := Append(nil, accounted)
	accountingAt := len(v3) - 1 - 8 - 1 // the target count, the opaque float, the byte
	spoil := func(f func(data []byte)) []byte {
		data := append([]byte{}, v3...)
		f(data)
		return data
	}
	unknownAccounting := spoil(func(data []byte) { data[accountingAt] = 9 })
	opaqueOverConcurrency := spoil(func(data []byte) {
		binary.LittleEndian.PutUint64(data[accountingAt+1:], math.Float64bits(3))
	})
	opaqueOverHTTP1 := spoil(func(data []byte) { data[accountingAt] = byte(AccountingHTTP1Requests) })
	defaultAccounting := spoil(func(data []byte) {
		data[accountingAt] = byte(AccountingHTTP1Requests)
		binary.LittleEndian.PutUint64(data[accountingAt+1:], 0)
	})
	negativeOpaque := spoil(func(data []byte) {
		binary.LittleEndian.PutUint64(data[accountingAt+1:], math.Float64bits(-1))
	})
	// A version 4 batch of one IPv6 pod, then the same with its address
	// made IPv4-mapped: the address starts after the header, at v4AddrAt.
	v4, _ := Append(nil, withIPv6(batchOf(1)))
	v4AddrAt := len(v4) - (16 + 1 + len("team-0") + 1 + len("hello-7d9f8b6c5d-00000") + 1 + len("hello") + 8 + 8 + 1 + 1 + 1 + 8 + 1)
	if got := netip.AddrFrom16([16]byte(v4[v4AddrAt:])); got != netip.MustParseAddr("fd00::") {
		t.Fatalf("the test's offset of the IPv6 address is wrong: %v there", got)
	}
	v4OnlyIPv4 := append([]byte{}, v4...)
	copy(v4OnlyIPv4[v4AddrAt:], netip.MustParseAddr("::ffff:10.1.0.0").AsSlice())
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, `does not start with "SSST"`},
		{"other magic", []byte("JSON{}"), `does not start with "SSST"`},
		{"future version", append([]byte("SSST"), 9), "version 9, this controller reads versions 1 to 4"},
		{"version 0", append([]byte("SSST"), 0), "version 0, this controller reads versions 1 to 4"},
		{"version 4 with IPv4 pods only", v4OnlyIPv4, "version 4 with every pod address IPv4"},
		{"truncated version 4", v4[:len(v4)-5], "pod record 0: malformed stats batch: opaque concurrency at byte"},
		{"version 4 count beyond data", v4[:v4AddrAt+33], "1 pods cannot fit"},
		{"truncated", good[:len(good)-5], "pod record 1"},
		{"trailing bytes", append(append([]byte{}, good...), 0), "1 bytes after the last record"},
		{"negative concurrency", neg, "concurrency at byte"},
		{"count beyond data", append([]byte("SSST\x01\x00\x00\x02"), 0xff, 0xff, 0x03), "cannot fit"},
		{"zero period", []byte("SSST\x01\x00\x00\x00\x00"), "period 0s out of range"},
		{"overlong varint", []byte("SSST\x01\x80\x00"), "node length at byte 5: truncated or overlong varint"},
		{"truncated target", withTarget[:len(withTarget)-3], "target record 0"},
		{"version 2 without targets", noTargets, "version 2 with no target records"},
		{"target count beyond data", []byte("SSST\x02\x00\x00\x02\x00\xff\x03"), "targets cannot fit"},
		{"unknown accounting", unknownAccounting, "accounting 9: want 0 (HTTP/1 requests), 1 (HTTP/2 streams) or 2 (connections)"},
		{"opaque above concurrency", opaqueOverConcurrency, "opaque concurrency 3 exceeds the concurrency 2"},
		{"opaque without connections", opaqueOverHTTP1, "opaque concurrency 1 with accounting HTTP/1 requests"},
		{"negative opaque", negativeOpaque, "opaque concurrency at byte"},
		{"version 3 without accounting", defaultAccounting, "version 3 with every pod at the default accounting"},
		{"truncated accounting", v3[:accountingAt], "pod record 0: malformed stats batch: accounting at byte"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decode(tt.data)
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("err = %v, want ErrMalformed", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %q, want it to mention %q", err, tt.want)
			}
		})
	}
}

func FuzzDecode(f *testing.F) {
	for _, n := range []int{0, 1, 3} {
		data, _ := Append(nil, batchOf(n))
		f.Add(data)
		data, _ = Append(nil, withTargets(batchOf(n), n+1))
		f.Add(data)
		data, _ = Append(nil, withAccounting(batchOf(n+1)))
		f.Add(data)
		data, _ = Append(nil, withTargets(withAccounting(batchOf(n+1)), n))
		f.Add(data)
		data, _ = Append(nil, withTargets(withIPv6(batchOf(n+1)), n))
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := Decode(data)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error does not wrap ErrMalformed: %v", err)
			}
			return
		}
		// What decodes must encode back to the same bytes.
		again, err := Append(nil, b)
		if err != nil {
			t.Fatalf("re-encode a decoded batch: %v", err)
		}
		if !bytes.Equal(again, data) {
			t.Fatalf("re-encoded batch differs:\n%x\n%x", data, again)
		}
	})
}

func BenchmarkEncode100(b *testing.B) {
	batch := batchOf(100)
	buf := make([]byte, 0, 16<<10)
	for b.Loop() {
		buf, _ = Append(buf[:0], batch)
	}
	b.SetBytes(int64(len(buf)))
}

func BenchmarkDecode100(b *testing.B) {
	data, _ := Append(nil, batchOf(100))
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := Decode(data); err != nil {
			b.Fatal(err)
		}
	}
}
