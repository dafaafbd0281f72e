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
		withAccounting(batchOf(1)), withAccounting(batchOf(100)), withTargets(withAccounting(batchOf(3)), 2)} {
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
	b = batchOf(1)
	b.Pods[0].IP = netip.MustParseAddr("fd00::1")
	if _, err := Append(nil, b); err == nil || !strings.Contains(err.Error(), "fd00::1 is not IPv4") {
		t.Errorf("IPv6 pod: err = %v", err)
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
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, `does not start with "SSST"`},
		{"other magic", []byte("JSON{}"), `does not start with "SSST"`},
		{"future version", append([]byte("SSST"), 9), "version 9, this controller reads versions 1 to 3"},
		{"version 0", append([]byte("SSST"), 0), "version 0, this controller reads versions 1 to 3"},
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
