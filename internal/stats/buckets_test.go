package stats

import (
	"fmt"
	"strings"
	"testing"
)

func TestBucketOfIsPinnedAndSpreads(t *testing.T) {
	// Values of FNV-1a computed apart from this code: a change of hash
	// would split a running cluster's controllers and agents differently.
	for _, c := range []struct {
		ns, workload string
		count, want  int
	}{
		{"default", "hello", 4, 1},
		{"default", "hello", 64, 1},
		{"prod", "api", 8, 3},
		{"default", "hello", 1, 0},
	} {
		if got := BucketOf(c.ns, c.workload, c.count); got != c.want {
			t.Errorf("BucketOf(%s, %s, %d) = %d, want %d", c.ns, c.workload, c.count, got, c.want)
		}
	}
	// 10,000 targets over 8 buckets: each within 10 % of its share.
	const n, count = 10000, 8
	per := make([]int, count)
	for i := range n {
		per[BucketOf(fmt.Sprintf("ns-%d", i/100), fmt.Sprintf("t-%d", i), count)]++
	}
	for b, got := range per {
		if got < n/count*9/10 || got > n/count*11/10 {
			t.Errorf("bucket %d has %d of %d targets, want %d +- 10 %%: %v", b, got, n, n/count, per)
		}
	}
}

func TestBucketsHeader(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Buckets
	}{
		{"4;0,2", Buckets{Count: 4, Held: 0b101}},
		{"4;", Buckets{Count: 4}},
		{"64;63", Buckets{Count: 64, Held: 1 << 63}},
	} {
		got, err := ParseBuckets(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseBuckets(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
		if s := got.String(); s != c.in {
			t.Errorf("%+v.String() = %q, want %q", got, s, c.in)
		}
	}
	for _, bad := range []struct{ in, want string }{
		{"", "want <count 2..64>"},
		{"4", "want <count 2..64>"},
		{"1;0", "want <count 2..64>"},
		{"65;0", "want <count 2..64>"},
		{"4;4", `bucket "4" is not in 0..3`},
		{"4;0,,1", `bucket "" is not in 0..3`},
		{"4;-1", `bucket "-1" is not in 0..3`},
	} {
		if _, err := ParseBuckets(bad.in); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("ParseBuckets(%q) = %v, want an error with %q", bad.in, err, bad.want)
		}
	}
}
