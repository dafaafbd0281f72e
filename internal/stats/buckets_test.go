package stats

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
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

func TestSplit(t *testing.T) {
	b := &Batch{Node: "n", Targets: []TargetStat{{Namespace: "default", Workload: "held"}}}
	byBucket := map[int][]string{}
	for i := range 12 {
		w := fmt.Sprintf("w-%d", i)
		b.Pods = append(b.Pods, PodStat{Namespace: "default", Workload: w})
		byBucket[BucketOf("default", w, 3)] = append(byBucket[BucketOf("default", w, 3)], w)
	}
	all := append(append(append([]string(nil), byBucket[0]...), byBucket[1]...), byBucket[2]...)
	workloads := func(p *Batch) []string {
		var ws []string
		for _, r := range p.Pods {
			ws = append(ws, r.Workload)
		}
		slices.Sort(ws)
		return ws
	}
	sorted := func(ws ...[]string) []string {
		out := slices.Concat(ws...)
		slices.Sort(out)
		return out
	}
	for _, c := range []struct {
		name   string
		routes []Buckets
		want   [][]string
	}{
		{"nobody splits: b itself to each", []Buckets{{}, {}}, [][]string{sorted(all), sorted(all)}},
		{"two split, one takes all", []Buckets{{Count: 3, Held: 0b001}, {Count: 3, Held: 0b110}, {}},
			[][]string{sorted(byBucket[0]), sorted(byBucket[1], byBucket[2]), sorted(all)}},
		{"bucket 2 unclaimed: to every splitting replica", []Buckets{{Count: 3, Held: 0b001}, {Count: 3, Held: 0b010}},
			[][]string{sorted(byBucket[0], byBucket[2]), sorted(byBucket[1], byBucket[2])}},
	} {
		t.Run(c.name, func(t *testing.T) {
			parts := Split(b, c.routes)
			for i, p := range parts {
				if diff := cmp.Diff(c.want[i], workloads(p)); diff != "" {
					t.Errorf("replica %d's records (-want +got):\n%s", i, diff)
				}
				if len(p.Targets) != 1 || p.Node != "n" {
					t.Errorf("replica %d lost the batch's node or target records: %+v", i, p)
				}
				if c.routes[i].Count == 0 && p != b {
					t.Errorf("replica %d takes every record but got a copy", i)
				}
			}
		})
	}
}
