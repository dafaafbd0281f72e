package stats

import (
	"bytes"
	"errors"
	"fmt"
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

func TestRoundTrip(t *testing.T) {
	for _, b := range []*Batch{batchOf(0), batchOf(1), batchOf(100), withTargets(batchOf(0), 1), withTargets(batchOf(3), 20)} {
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
// which controllers from before version 2 read during an upgrade.
func TestVersionFollowsContent(t *testing.T) {
	for _, tc := range []struct {
		b    *Batch
		want byte
	}{{batchOf(3), 1}, {withTargets(batchOf(0), 1), 2}, {withTargets(batchOf(3), 2), 2}} {
		data, err := Append(nil, tc.b)
		if err != nil {
			t.Fatal(err)
		}
		if got := data[len(magic)]; got != tc.want {
			t.Errorf("%d pods, %d targets: version %d, want %d", len(tc.b.Pods), len(tc.b.Targets), got, tc.want)
		}
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
}

func TestDecodeErrorsSayWhat(t *testing.T) {
	good, _ := Append(nil, batchOf(2))
	negative := batchOf(1)
	negative.Pods[0].Concurrency = -1
	neg, _ := Append(nil, negative)
	withTarget, _ := Append(nil, withTargets(batchOf(1), 1))
	// A version 2 header, no pods, then a target count of 0.
	noTargets := []byte("SSST\x02\x00\x00\x02\x00\x00")
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, `does not start with "SSST"`},
		{"other magic", []byte("JSON{}"), `does not start with "SSST"`},
		{"future version", append([]byte("SSST"), 9), "version 9, this controller reads versions 1 and 2"},
		{"truncated", good[:len(good)-5], "pod record 1"},
		{"trailing bytes", append(append([]byte{}, good...), 0), "1 bytes after the last record"},
		{"negative concurrency", neg, "concurrency at byte"},
		{"count beyond data", append([]byte("SSST\x01\x00\x00\x02"), 0xff, 0xff, 0x03), "cannot fit"},
		{"zero period", []byte("SSST\x01\x00\x00\x00\x00"), "period 0s out of range"},
		{"overlong varint", []byte("SSST\x01\x80\x00"), "node length at byte 5: truncated or overlong varint"},
		{"truncated target", withTarget[:len(withTarget)-3], "target record 0"},
		{"version 2 without targets", noTargets, "version 2 with no target records"},
		{"target count beyond data", []byte("SSST\x02\x00\x00\x02\x00\xff\x03"), "targets cannot fit"},
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
