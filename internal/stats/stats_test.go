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

func TestRoundTrip(t *testing.T) {
	for _, n := range []int{0, 1, 100} {
		want := batchOf(n)
		data, err := Append(nil, want)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(data)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got, cmpopts.EquateEmpty(), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
			t.Errorf("%d pods: round trip (-want +got):\n%s", n, diff)
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
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, `does not start with "SSST"`},
		{"other magic", []byte("JSON{}"), `does not start with "SSST"`},
		{"future version", append([]byte("SSST"), 9), "version 9, this controller reads version 1"},
		{"truncated", good[:len(good)-5], "pod record 1"},
		{"trailing bytes", append(append([]byte{}, good...), 0), "1 bytes after the last record"},
		{"negative concurrency", neg, "concurrency at byte"},
		{"count beyond data", append([]byte("SSST\x01\x00\x00\x02"), 0xff, 0xff, 0x03), "cannot fit"},
		{"zero period", []byte("SSST\x01\x00\x00\x00\x00"), "period 0s out of range"},
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
